"""KV-cache bytes per token, and how many tokens a pool of bytes holds under vLLM's block rules.

Per layer and token a GPU stores `2 x kv_heads_per_gpu x head_dim x kv_dtype_bytes`, with
`kv_heads_per_gpu = max(1, kv_heads // TP)`: GQA heads split across tensor-parallel ranks until there are more
ranks than heads, then every rank keeps a copy. MLA models store one latent of `kv_lora_rank + qk_rope_head_dim`
per layer, no factor 2 and no split (every TP rank holds the whole latent). vLLM's V0 engine laid MLA models out
otherwise: before v0.7 as ordinary attention with a head size of 256, from v0.7 as a latent padded to 256 bytes
(`mla_bytes_per_token_per_layer` cites the source).

Pools are counted in blocks of `block_size` tokens. A model whose layers all use the same attention is one group:
`blocks = floor(pool / (layers x block bytes))`. Models mixing sliding-window and full layers (Gemma 2/3,
gpt-oss) use vLLM's hybrid allocator: layers are cut into groups of equal size, every group draws pages from one
shared pool, and a request needs whole-context pages in full groups but only window-sized ones in sliding groups
(the window plus the tokens in flight, `Deployment.in_flight_tokens`); the engine then reports tokens as
`max concurrency x max_model_len`.
"""

import math
from dataclasses import dataclass

from exporter.capacity import assumptions as A
from exporter.capacity.architecture import FULL, SLIDING, ModelArchitecture
from exporter.capacity.deployment import PipelineStage

KV_DTYPE_BYTES = {
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float32": 4,
}


# vLLM cached DeepSeek-V2/V3 as MLA latents from v0.7.1 on; versions are (major, minor) here, so 0.7.0 counts as
# MLA (misplaced). Before, ModelConfig.get_head_size gave every deepseek_v2/deepseek_v3 head 256 ("FlashAttention
# supports only head_size 32, 64, 128, 256, we need to pad head_size 192 to 256": vllm-project/vllm vllm/config.py
# @ 0004438) and CacheEngine kept K and V for each of the model's num_key_value_heads split by TP.
VLLM_MLA_CACHE_SINCE = (0, 7)
VLLM_V0_DEEPSEEK_HEAD_SIZE = 256
# V0's CacheEngine.get_cache_block_size pads each MLA entry on CUDA to a multiple of 256 bytes counted in the
# *model* dtype (align_to_256bytes(entry, model_config.dtype), then times the cache dtype's size; env
# VLLM_CUDA_MEM_ALIGN_KV_CACHE, on by default): vllm-project/vllm PR #12676 (merged Feb 2025, first in v0.7.2, so
# v0.7.1 is misplaced here), removed by PR #14842 (Mar 2025) as V1 took over. 576 bf16 elements become 640.
VLLM_V0_MLA_ALIGN_BYTES = 256


class KvDtypeError(ValueError):
    """An unknown --kv-cache-dtype."""


def kv_dtype_bytes(kv_cache_dtype: str, weight_bytes: int) -> int:
    """ "auto" stores KV in the dtype the weights are served in."""
    if kv_cache_dtype == "auto":
        return weight_bytes
    if kv_cache_dtype not in KV_DTYPE_BYTES:
        raise KvDtypeError(f"--kv-cache-dtype {kv_cache_dtype!r} is not one of auto, {', '.join(KV_DTYPE_BYTES)}")
    return KV_DTYPE_BYTES[kv_cache_dtype]


def kv_heads_per_gpu(arch: ModelArchitecture, tp: int) -> int:
    return 1 if arch.mla is not None else max(1, arch.num_kv_heads // tp)


def mla_bytes_per_token_per_layer(
    arch: ModelArchitecture, tp: int, dtype_bytes: int, vllm_version: tuple[int, int] | None, model_dtype_bytes: int
) -> int:
    """An MLA model's share of a token in one layer as the vLLM of `vllm_version` (None: current) caches it.

    V1 (`MLAAttentionSpec`) stores the bare latent. V0 from v0.7 pads it to 256 bytes of the model dtype; V0 before
    v0.7 caches K and V per head at head size 256 (the constants above cite the source)."""
    assert arch.mla is not None
    latent = arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim
    if vllm_version is None or vllm_version >= A.VLLM_V1_SINCE:
        return latent * dtype_bytes
    if vllm_version < VLLM_MLA_CACHE_SINCE:
        return 2 * max(1, arch.num_kv_heads // tp) * VLLM_V0_DEEPSEEK_HEAD_SIZE * dtype_bytes
    per_alignment = VLLM_V0_MLA_ALIGN_BYTES // model_dtype_bytes
    return math.ceil(latent / per_alignment) * per_alignment * dtype_bytes


def kv_bytes_per_token_per_layer(
    arch: ModelArchitecture, tp: int, dtype_bytes: int, vllm_version: tuple[int, int] | None, model_dtype_bytes: int
) -> int:
    if arch.mla is not None:
        return mla_bytes_per_token_per_layer(arch, tp, dtype_bytes, vllm_version, model_dtype_bytes)
    return 2 * kv_heads_per_gpu(arch, tp) * arch.head_dim * dtype_bytes


def full_layer_bytes_per_token(
    arch: ModelArchitecture, tp: int, dtype_bytes: int, vllm_version: tuple[int, int] | None, model_dtype_bytes: int
) -> int:
    """A full-attention layer's share of a token: Gemma 4's have their own head_dim and KV heads."""
    if arch.full_head_dim is None and arch.full_kv_heads is None:
        return kv_bytes_per_token_per_layer(arch, tp, dtype_bytes, vllm_version, model_dtype_bytes)
    heads = max(1, (arch.full_kv_heads or arch.num_kv_heads) // tp)
    return 2 * heads * (arch.full_head_dim or arch.head_dim) * dtype_bytes


@dataclass(frozen=True)
class KvLayout:
    """The KV cache of one GPU: which layers it holds and what a token costs in each."""

    bytes_per_token_per_layer: int  # a sliding layer's, and every layer's unless full_layer_bytes says otherwise
    full_layers: int
    sliding_layers: int
    sliding_window: int | None
    full_layer_bytes: int | None = None  # a full-attention layer's where it differs (Gemma 4)

    @property
    def layers(self) -> int:
        return self.full_layers + self.sliding_layers

    @property
    def full_bytes_per_token_per_layer(self) -> int:
        return self.bytes_per_token_per_layer if self.full_layer_bytes is None else self.full_layer_bytes

    @property
    def bytes_per_token(self) -> int:
        """Every layer's share of one token: what a token costs while the context is inside the window."""
        return self.bytes_per_token_per_layer * self.sliding_layers + self.full_bytes_per_token_per_layer * (
            self.full_layers
        )

    @property
    def is_hybrid(self) -> bool:
        return self.full_layers > 0 and self.sliding_layers > 0

    @property
    def page_bytes_per_token(self) -> int:
        """A block's bytes per token slot in one layer: the larger of the two kinds' shares. vLLM gives both kinds
        one page size (unify_kv_cache_spec_page_size in vllm/v1/core/kv_cache_utils.py) by multiplying the block
        size of the kind whose page is smaller."""
        kinds = [
            b
            for b, n in (
                (self.bytes_per_token_per_layer, self.sliding_layers),
                (self.full_bytes_per_token_per_layer, self.full_layers),
            )
            if n
        ]
        return max(kinds or [self.bytes_per_token_per_layer])

    def tokens_per_block(self, block_size: int, kind: str) -> int:
        """Tokens a block of `kind` (FULL or SLIDING) holds once the page sizes are unified."""
        own = self.full_bytes_per_token_per_layer if kind == FULL else self.bytes_per_token_per_layer
        return block_size * (self.page_bytes_per_token // own)


def kv_layout(
    arch: ModelArchitecture,
    tp: int = 1,
    stage: PipelineStage | None = None,
    dtype_bytes: int = 2,
    vllm_version: tuple[int, int] | None = None,
    model_dtype_bytes: int = 2,
) -> KvLayout:
    """The KV cache of one GPU of a pipeline stage (None: the whole model). Layers that share an earlier layer's
    KV (Gemma 4's num_kv_shared_layers) keep no cache of their own. `vllm_version` (None: current vLLM) and the
    model's dtype (`model_dtype_bytes`) matter only to MLA models, which older vLLM laid out differently."""
    first, layers = (0, arch.num_layers) if stage is None else (stage.first_layer, stage.layers)
    own_cache = arch.num_layers - arch.kv_shared_layers
    types = arch.layer_types[first : min(first + layers, own_cache)]
    full = full_layer_bytes_per_token(arch, tp, dtype_bytes, vllm_version, model_dtype_bytes)
    sliding = kv_bytes_per_token_per_layer(arch, tp, dtype_bytes, vllm_version, model_dtype_bytes)
    return KvLayout(
        bytes_per_token_per_layer=sliding,
        full_layers=types.count(FULL),
        sliding_layers=types.count(SLIDING),
        sliding_window=arch.sliding_window,
        full_layer_bytes=full if full != sliding else None,
    )


@dataclass(frozen=True)
class KvPool:
    """What a pool of KV bytes holds."""

    num_blocks: int
    block_size: int
    tokens: int  # as the engine reports it (vLLM's "GPU KV cache size")
    max_concurrency: float  # requests of max_model_len tokens that fit at once
    blocks_per_request: int
    block_bytes: int  # one block across the layers that share it
    pool_bytes: int  # the bytes the blocks really occupy


def _group_size(full: int, sliding: int) -> int:
    """vLLM's layers-per-group for a hybrid model: the smaller count, or the larger when they are close."""
    small, large = min(full, sliding), max(full, sliding)
    return large if large < 1.5 * small else small


def _sliding_blocks(window: int, context: int, in_flight_tokens: int, block_size: int) -> int:
    # A sliding layer keeps the window plus the tokens scheduled but not yet settled, and one block of slack.
    return math.ceil(min(window - 1 + in_flight_tokens, context) / block_size) + 1


def _blocks_per_layer_group(layout: KvLayout) -> int:
    """Layers that share one block of the pool: all of them, or a hybrid model's group size."""
    if layout.is_hybrid:
        return _group_size(layout.full_layers, layout.sliding_layers)
    return layout.layers


def blocks_per_request(layout: KvLayout, context: int, block_size: int, in_flight_tokens: int) -> int:
    """Pool blocks one request of `context` tokens holds at its longest."""
    full = math.ceil(context / layout.tokens_per_block(block_size, FULL))
    if layout.sliding_window is None or layout.sliding_layers == 0:
        return full
    window = _sliding_blocks(
        layout.sliding_window, context, in_flight_tokens, layout.tokens_per_block(block_size, SLIDING)
    )
    if not layout.is_hybrid:
        return window
    group = _blocks_per_layer_group(layout)
    return math.ceil(layout.full_layers / group) * full + math.ceil(layout.sliding_layers / group) * window


def kv_group_count(layout: KvLayout) -> int:
    """KV-cache groups vLLM forms: one for a uniform model, one per group of layers for a hybrid one."""
    if not layout.is_hybrid:
        return 1
    group = _blocks_per_layer_group(layout)
    return math.ceil(layout.full_layers / group) + math.ceil(layout.sliding_layers / group)


def kv_pool(
    layout: KvLayout,
    pool_bytes: int,
    block_size: int,
    max_model_len: int,
    in_flight_tokens: int,
    legacy_token_count: bool = False,
) -> KvPool:
    """Blocks, tokens and concurrency that `pool_bytes` of KV memory on one GPU give.

    `legacy_token_count`: vLLM before v0.12 reported a hybrid model's tokens as blocks per group x block size
    instead of concurrency x max_model_len; the daemon compares with whichever the engine prints."""
    if layout.layers == 0:
        raise ValueError("a KV layout with no layers holds no tokens")
    block_bytes = block_size * layout.page_bytes_per_token * _blocks_per_layer_group(layout)
    num_blocks = max(0, pool_bytes) // block_bytes
    per_request = blocks_per_request(layout, max_model_len, block_size, in_flight_tokens)
    concurrency = num_blocks / per_request
    windowed = layout.sliding_layers > 0 and layout.sliding_window is not None
    if legacy_token_count or not windowed:
        tokens = num_blocks // kv_group_count(layout) * block_size
    else:
        tokens = int(concurrency * max_model_len)
    return KvPool(
        num_blocks=num_blocks,
        block_size=block_size,
        tokens=tokens,
        max_concurrency=concurrency,
        blocks_per_request=per_request,
        block_bytes=block_bytes,
        pool_bytes=num_blocks * block_bytes,
    )
