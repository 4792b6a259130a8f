"""The memory bandwidth a bench divides by: read off the device, never a constant."""

from __future__ import annotations

import pytest

from buildkit import write_script
from polyforge.bench import bandwidth
from polyforge.errors import EnvironmentProblem


def test_peak_from_clock_and_bus():
    # an H100 SXM's HBM3: 2619 MHz, 5120 bits, two transfers a clock
    assert bandwidth.peak_gbps(2_619_000, 5120) == pytest.approx(3352.3, abs=0.1)


def test_reference_is_the_peak_where_known():
    gpu = bandwidth.MemoryBandwidth("GPU", 3352.3, 2950.0)
    host = bandwidth.MemoryBandwidth("host", None, 12.5)
    assert gpu.reference_gbps == 3352.3 and host.reference_gbps == 12.5
    assert bandwidth.MemoryBandwidth.from_dict(gpu.as_dict()) == gpu
    assert gpu.describe() == "GPU: peak 3352 GB/s, copy 2950 GB/s"
    assert bandwidth.MemoryBandwidth.of(4800).describe() == "4800 GB/s (given)"


def test_host_copy_is_measured():
    measured = bandwidth.measure_host(megabytes=64, repetitions=2)
    assert measured.device == "host" and measured.peak_gbps is None and measured.copy_gbps > 0


def _fake_nvcc(tmp_path, monkeypatch, probe_output: str, exit_code: int = 0):
    """An nvcc that 'compiles' the probe into a script printing probe_output; counts its compilations."""
    script = f"#!/bin/sh\necho '{probe_output}'\nexit {exit_code}\n"
    nvcc = write_script(tmp_path / "nvcc", f"""\
import sys, os
out = sys.argv[sys.argv.index("-o") + 1]
assert open(sys.argv[-1]).read().startswith("\\n#include <cuda_runtime.h>")
with open(out, "w") as f:
    f.write({script!r})
os.chmod(out, 0o755)
open(__file__ + ".calls", "a").write("x\\n")
""")
    monkeypatch.setenv("CUDACXX", str(nvcc))
    return nvcc


def test_cuda_probe_compiled_once_and_read(tmp_path, monkeypatch):
    nvcc = _fake_nvcc(tmp_path, monkeypatch, '{"device": "NVIDIA H100 80GB HBM3", "bus_width_bits": 5120, '
                                             '"memory_clock_khz": 2619000, "copy_gbps": 2950.4}')
    for _ in range(2):
        measured = bandwidth.measure(cuda=True, work_dir=tmp_path / "probes")
        assert measured == bandwidth.MemoryBandwidth("NVIDIA H100 80GB HBM3", 3352.3, 2950.4)
    assert len((tmp_path / "nvcc.calls").read_text().splitlines()) == 1  # cached by the source's digest
    assert nvcc.is_file()


def test_cuda_probe_failure_is_one_clear_error(tmp_path, monkeypatch):
    _fake_nvcc(tmp_path, monkeypatch, "", exit_code=1)
    with pytest.raises(EnvironmentProblem, match="the bandwidth probe failed"):
        bandwidth.measure(cuda=True, work_dir=tmp_path / "probes")
