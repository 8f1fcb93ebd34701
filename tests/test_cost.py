import pytest

from exporter.cost import gpu_hour_price, gpus_hourly_cost, unpriced_gpus

PRICES = (("A100-80GB", 1.8), ("H100", 2.49), ("my-card", 0.5))


def test_a_price_keyed_by_an_alias_prices_the_nvml_product_name_of_the_same_preset() -> None:
    assert gpu_hour_price(PRICES, "NVIDIA H100 80GB HBM3") == 2.49
    assert gpu_hour_price(PRICES, "H100-80GB") == 2.49


def test_an_exact_key_wins_and_an_unknown_name_is_priced_only_by_an_exact_key() -> None:
    assert gpu_hour_price(PRICES, "my-card") == 0.5
    assert gpu_hour_price(PRICES, "another-card") is None


def test_a_gpu_no_key_names_has_no_price() -> None:
    assert gpu_hour_price(PRICES, "NVIDIA H200") is None
    assert gpu_hour_price((), "H100") is None


def test_gpus_cost_the_sum_of_their_prices_whatever_name_each_goes_by() -> None:
    names = ("NVIDIA H100 80GB HBM3", "H100-80GB", "A100-80GB", "my-card")
    assert gpus_hourly_cost(PRICES, names) == pytest.approx(2.49 + 2.49 + 1.8 + 0.5)


def test_one_gpu_without_a_price_leaves_the_whole_cost_unknown() -> None:
    assert gpus_hourly_cost(PRICES, ("H100", "NVIDIA L4")) is None


def test_no_gpus_have_no_cost_rather_than_a_cost_of_zero() -> None:
    assert gpus_hourly_cost(PRICES, ()) is None


def test_the_unpriced_gpus_are_named_once_each() -> None:
    names = ("NVIDIA H200", "H100", "NVIDIA L4", "NVIDIA H200")
    assert unpriced_gpus(PRICES, names) == ("NVIDIA H200", "NVIDIA L4")
    assert unpriced_gpus(PRICES, ("H100", "my-card")) == ()
