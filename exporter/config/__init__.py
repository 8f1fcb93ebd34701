"""The daemon's YAML config: read (with ${ENV} expansion), validated (every problem of the whole file collected in
one pass, each naming the file and the field path), and handed out as frozen objects.

    config.yaml: targets[1].url: 'localhost:8000' is not a URL (expected http://host:port/path)

model holds the frozen values the rest of the program receives; loading reads files and YAML safely; validators
check one field's value and reader walks a mapping collecting problems; targets, discovery, slos, alerting,
autoscaling and pricing each read one section; document reads the whole file. The names below are the API.

May import core/, capacity/, catalog.py and files.py; never sources/, daemon/ or a command.
"""

from exporter.config.autoscaling import check_model_labels
from exporter.config.discovery import SCAN_PORTS, engine_problem, parse_target_file, scan_targets
from exporter.config.document import check_config, check_config_file, field_problems, load_config, parse_config
from exporter.config.loading import load_yaml, load_yaml_documents, read_config_text
from exporter.config.model import (
    DEFAULT_LISTEN,
    DEFAULT_PORT,
    ENGINE_NAMES,
    AlertingConfig,
    AutoscalingConfig,
    BasicAuth,
    Config,
    ConfigError,
    ConfigReport,
    KubernetesDiscovery,
    ScaledWorkload,
    SloConfig,
    Target,
    restart_required,
)
from exporter.config.validators import (
    label_value,
    readable_file,
    redact_url,
    validate_boolean,
    validate_duration,
    validate_listen,
    validate_url,
)

__all__ = [
    "DEFAULT_LISTEN",
    "DEFAULT_PORT",
    "ENGINE_NAMES",
    "SCAN_PORTS",
    "AlertingConfig",
    "AutoscalingConfig",
    "BasicAuth",
    "Config",
    "ConfigError",
    "ConfigReport",
    "KubernetesDiscovery",
    "ScaledWorkload",
    "SloConfig",
    "Target",
    "check_config",
    "check_config_file",
    "check_model_labels",
    "engine_problem",
    "field_problems",
    "label_value",
    "load_config",
    "load_yaml",
    "load_yaml_documents",
    "parse_config",
    "parse_target_file",
    "read_config_text",
    "readable_file",
    "redact_url",
    "restart_required",
    "scan_targets",
    "validate_boolean",
    "validate_duration",
    "validate_listen",
    "validate_url",
]
