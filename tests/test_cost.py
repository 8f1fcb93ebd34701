from exporter.cost import gpu_hour_price

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
