"""The memory bandwidth a bench's rows are measured against, read off the machine it runs on.

A decode step of a long-context model reads its weights and its KV cache once, so the fraction of the
memory bandwidth a row reaches tells how far the kernels are from what the machine allows. The
bandwidth differs by machine (an H100 SXM's HBM3 is 3.35 TB/s, an H200's 4.8 TB/s, a PCIe card's less),
so it is never a constant: `measure` asks the device the bench runs on.

  - a CUDA build: a small probe, compiled with the build's nvcc, reads the GPU's memory clock and bus
    width (the peak, 2 transfers per clock) and times device-to-device copies (read + write);
  - a CPU build: numpy copies of arrays far larger than the caches (there is no peak to read).

`reference_gbps` is what rows are divided by: the peak where the device names one, else the copy rate.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from polyforge import proc
from polyforge.build import toolchain
from polyforge.errors import EnvironmentProblem

PROBE_SOURCE = r"""
#include <cuda_runtime.h>
#include <cstdio>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
    fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

int main() {
    int dev = 0, bus_bits = 0, clock_khz = 0;
    CHECK(cudaSetDevice(dev));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, dev));
    CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev));
    CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev));
    const size_t bytes = (size_t) 1 << 30;  // far beyond the L2 cache
    void * src = nullptr; void * dst = nullptr;
    CHECK(cudaMalloc(&src, bytes));
    CHECK(cudaMalloc(&dst, bytes));
    CHECK(cudaMemset(src, 1, bytes));
    CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));  // warm-up
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    const int reps = 20;
    float best_ms = 1e30f;
    for (int i = 0; i < reps; ++i) {
        CHECK(cudaEventRecord(start));
        CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
        CHECK(cudaEventRecord(stop));
        CHECK(cudaEventSynchronize(stop));
        float ms = 0.0f;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        best_ms = ms < best_ms ? ms : best_ms;
    }
    // a copy reads and writes every byte
    printf("{\"device\": \"%s\", \"bus_width_bits\": %d, \"memory_clock_khz\": %d, \"copy_gbps\": %.1f}\n",
           prop.name, bus_bits, clock_khz, 2.0 * bytes / (best_ms * 1e-3) / 1e9);
    return 0;
}
"""


@dataclass(frozen=True)
class MemoryBandwidth:
    device: str  # the GPU's name, or "host"
    peak_gbps: float | None  # from the memory clock and bus width; None where the device names none
    copy_gbps: float  # measured: bytes read and written per second by a large copy
    given: bool = False  # the user gave the figure (--bandwidth N) instead of a measurement

    @property
    def reference_gbps(self) -> float:
        return self.peak_gbps if self.peak_gbps else self.copy_gbps

    def as_dict(self) -> dict:
        return {**asdict(self), "reference_gbps": self.reference_gbps}

    @staticmethod
    def from_dict(data: dict | None) -> "MemoryBandwidth | None":
        if not data:
            return None
        return MemoryBandwidth(data["device"], data.get("peak_gbps"), data["copy_gbps"], data.get("given", False))

    @staticmethod
    def of(gbps: float) -> "MemoryBandwidth":
        """A figure the user gave."""
        return MemoryBandwidth("given", gbps, gbps, given=True)

    def describe(self) -> str:
        if self.given:
            return f"{self.reference_gbps:g} GB/s (given)"
        peak = f"peak {self.peak_gbps:.0f} GB/s, " if self.peak_gbps else ""
        return f"{self.device}: {peak}copy {self.copy_gbps:.0f} GB/s"


def peak_gbps(memory_clock_khz: int, bus_width_bits: int) -> float:
    """Double data rate: two transfers of bus_width bits per memory clock."""
    return 2 * memory_clock_khz * 1e3 * bus_width_bits / 8 / 1e9


def measure(*, cuda: bool, work_dir: Path) -> MemoryBandwidth:
    return measure_cuda(work_dir) if cuda else measure_host()


def measure_cuda(work_dir: Path) -> MemoryBandwidth:
    """Compile (once per source, into work_dir) and run the probe on GPU 0."""
    nvcc = toolchain.find_nvcc()
    if nvcc is None:
        raise EnvironmentProblem("measuring the GPU's memory bandwidth needs nvcc", hint="or give --bandwidth GB/s")
    digest = hashlib.sha256(PROBE_SOURCE.encode()).hexdigest()[:12]
    exe = work_dir / f"memory-bandwidth-{digest}"
    if not exe.is_file():
        work_dir.mkdir(parents=True, exist_ok=True)
        source = exe.with_suffix(".cu")
        source.write_text(PROBE_SOURCE)
        done = proc.run([nvcc, "-O2", "-o", exe, source], timeout=300)
        if done.returncode != 0:
            raise EnvironmentProblem(f"the bandwidth probe did not compile: {(done.stderr.strip().splitlines() or ['?'])[-1]}",
                                     hint="or give --bandwidth GB/s")
    done = proc.run([exe], timeout=120)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("{")), None)
    if done.returncode != 0 or line is None:
        raise EnvironmentProblem(f"the bandwidth probe failed: {(done.stderr.strip().splitlines() or ['no output'])[-1]}",
                                 hint="or give --bandwidth GB/s")
    data = json.loads(line)
    peak = peak_gbps(data["memory_clock_khz"], data["bus_width_bits"]) if data["memory_clock_khz"] > 0 else None
    return MemoryBandwidth(data["device"], round(peak, 1) if peak else None, data["copy_gbps"])


def measure_host(megabytes: int = 512, repetitions: int = 5) -> MemoryBandwidth:
    """The best of a few copies of an array far larger than the CPU's caches."""
    import numpy as np

    src = np.ones(megabytes * 2**20, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repetitions):
        started = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - started)
    return MemoryBandwidth("host", None, round(2 * src.nbytes / best / 1e9, 1))
