"""The device extra's S3 pins (requirements/device-s3.txt) agree with the build box's constraints."""

from __future__ import annotations

from helpers import ROOT, read_pins


def test_device_s3_pins_agree_with_constraints():
    """requirements/device-s3.txt = constraints.txt + the S3 packages, with only fsspec moved (pyproject.toml)."""
    base, s3 = (read_pins(ROOT / "requirements" / f) for f in ("constraints.txt", "device-s3.txt"))
    assert set(s3) - set(base) == {"aiobotocore", "aioitertools", "botocore", "dvc-s3", "jmespath", "s3fs"}
    assert {k for k in s3.keys() & base.keys() if s3[k] != base[k]} == {"fsspec"}
    assert s3["dvc"] == base["dvc"] == "3.67.1"
