"""scripts/gpu_check.sh's variant / use-base / use-variant phases on a stand-in build folder (gcc as "nvcc",
ninja from the environment): the variant is compiled with its flags, each side's library is what runs, and a
swapped-in object survives (ninja would have compiled it again from the source)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.sh"
CUDA_DIR = "ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir"
INSTANCE_DIR = f"{CUDA_DIR}/template-instances"
LIB = "bin/libggml-cuda.so.0.1.0"
MMA_INSTANCE = "fattn-mma-f16-kv-dec-instance-ncols1_16-ncols2_2"

pytestmark = pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")


def _ninja() -> str:
    found = shutil.which("ninja") or str(Path(sys.executable).parent / "ninja")
    assert Path(found).exists(), "ninja is a dependency of polyforge"
    return found


def _build_folder(root: Path) -> Path:
    """A build folder shaped like polyforge's CUDA build: two instance objects and the library they make."""
    build = root / "build" / "cuda-test"
    (build / "bin").mkdir(parents=True)
    (root / "build" / "gpu-check.key").write_text("cuda-test\n")
    src = root / "src"
    src.mkdir()
    fake_nvcc = root / "fake-nvcc"
    fake_nvcc.write_text('#!/bin/sh\nexec gcc -fPIC "$@"\n')
    fake_nvcc.chmod(0o755)
    (src / "knob.h").write_text(
        "#if defined(EXP_KNOB3)\n#define VALUE 3\n#elif defined(EXP_KNOB)\n#define VALUE 2\n#else\n#define VALUE 1\n#endif\n")
    rules = [
        "rule nvcc\n  command = $nvcc -x c -I../../src -MD -MT $out -MF $out.d -o $out -c $in\n"
        "  depfile = $out.d\n  deps = gcc\n",
        "rule link\n  command = gcc -shared -o $out $in\n",
        f"nvcc = {fake_nvcc}\n",
    ]
    objs = []
    for stem, fn in (("fattn-vec-instance-turbo3-turbo3", "value_t3"), ("fattn-vec-instance-q8_0-turbo3", "value_q8"),
                     (MMA_INSTANCE, "value_mma"), ("fattn", "value_fattn")):
        (src / f"{stem}.cu").write_text(f'#include "knob.h"\nint {fn}(void) {{ return VALUE; }}\n')
        # ggml-cuda's own sources sit above the instances' folder
        obj = f"{CUDA_DIR}/{stem}.cu.o" if stem == "fattn" else f"{INSTANCE_DIR}/{stem}.cu.o"
        rules.append(f"build {obj}: nvcc ../../src/{stem}.cu\n")
        objs.append(obj)
    rules.append(f"build {LIB}: link {' '.join(objs)}\n")
    (build / "build.ninja").write_text("".join(rules))
    subprocess.run([_ninja()], cwd=build, check=True, capture_output=True)
    return build


def _call(build: Path, *functions: str) -> list[int]:
    """The library's functions' values, loaded in a fresh process (each side's library as it is on disk)."""
    code = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
            "print(*(getattr(lib, f)() for f in sys.argv[2:]))")
    out = subprocess.run([sys.executable, "-c", code, str(build / LIB), *functions],
                         capture_output=True, text=True, check=True)
    return [int(v) for v in out.stdout.split()]


def _values(build: Path) -> tuple[int, int]:
    t3, q8 = _call(build, "value_t3", "value_q8")
    return t3, q8


def _value_mma(build: Path) -> int:
    return _call(build, "value_mma")[0]


def _gpu_check(root: Path, out: Path, *phases: str, **env_extra: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(root), "POLYFORGE_NINJA": _ninja(), "PYTHON": sys.executable,
           "VARIANT_DEFS": "-DEXP_KNOB=1", "VARIANT_INSTANCES": "turbo3-turbo3", **env_extra}
    return subprocess.run(["bash", str(SCRIPT), str(out), *phases], cwd=root, env=env, capture_output=True, text=True)


def test_variant_and_both_sides(tmp_path: Path):
    build = _build_folder(tmp_path)
    assert _values(build) == (1, 1)
    out = tmp_path / "out"

    done = _gpu_check(tmp_path, out, "variant", "use-variant")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _values(build) == (2, 1)  # only the named instance, with the flags
    # ninja would recompile the swapped object (its deps-log entry is older): the variant must survive
    rebuilt = subprocess.run([_ninja(), "-n", "-d", "explain"], cwd=build, capture_output=True, text=True)
    assert "deps info out of date" in rebuilt.stderr + rebuilt.stdout

    done = _gpu_check(tmp_path, out, "use-base")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _values(build) == (1, 1)

    summary = (out / "summary.txt").read_text().splitlines()
    md5 = {line.split()[1].rstrip(":"): line.split()[-1] for line in summary if line.startswith("use ")}
    assert set(md5) == {"variant", "base"} and md5["variant"] != md5["base"]


def test_named_variants_keep_the_build_as_base(tmp_path: Path):
    build = _build_folder(tmp_path)
    out = tmp_path / "out"

    done = _gpu_check(tmp_path, out, "variant", "use-variant", VARIANT_NAME="two")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _values(build) == (2, 1)
    # a second variant compiled while the first is swapped in: the base stays the build's own object
    done = _gpu_check(tmp_path, out, "variant", VARIANT_NAME="three", VARIANT_DEFS="-DEXP_KNOB3=1")
    assert done.returncode == 0, done.stdout + done.stderr
    for name, values in (("three", (3, 1)), ("two", (2, 1)), ("base", (1, 1))):
        phase = "use-base" if name == "base" else "use-variant"
        done = _gpu_check(tmp_path, out, phase, VARIANT_NAME=name if name != "base" else "two")
        assert done.returncode == 0, done.stdout + done.stderr
        assert _values(build) == values, name
    sides = [line.split()[1].rstrip(":") for line in (out / "summary.txt").read_text().splitlines()
             if line.startswith("use ")]
    assert sides == ["two", "three", "two", "base"]


def test_variant_name_cannot_be_base(tmp_path: Path):
    _build_folder(tmp_path)
    done = _gpu_check(tmp_path, tmp_path / "out", "variant", VARIANT_NAME="base")
    assert done.returncode == 2
    assert "VARIANT_NAME must be" in done.stderr
    assert not (tmp_path / "build" / "cuda-test" / "ab").exists()


def test_variant_needs_flags(tmp_path: Path):
    _build_folder(tmp_path)
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out"), "variant"], cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "POLYFORGE_NINJA": _ninja()},
                          capture_output=True, text=True)
    assert done.returncode != 0
    assert "variant needs VARIANT_DEFS" in done.stderr
    assert not (tmp_path / "build" / "cuda-test" / "ab").exists()


def test_variant_of_an_instance_named_by_its_stem(tmp_path: Path):
    """A tensor-core instance file (not a vector instance by its types) is named by its stem."""
    build = _build_folder(tmp_path)
    out = tmp_path / "out"
    done = _gpu_check(tmp_path, out, "variant", "use-variant", VARIANT_INSTANCES=f"{MMA_INSTANCE} turbo3-turbo3")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (_value_mma(build), _values(build)) == (2, (2, 1))
    done = _gpu_check(tmp_path, out, "use-base", VARIANT_INSTANCES=f"{MMA_INSTANCE} turbo3-turbo3")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (_value_mma(build), _values(build)) == (1, (1, 1))


def test_variant_of_a_cuda_source_named_by_its_file(tmp_path: Path):
    """fattn.cu (the kernel choice) is compiled and swapped like an instance; the instances stay the build's."""
    build = _build_folder(tmp_path)
    out = tmp_path / "out"
    done = _gpu_check(tmp_path, out, "variant", "use-variant", VARIANT_INSTANCES="fattn.cu", VARIANT_NAME="choice")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (_call(build, "value_fattn")[0], _value_mma(build), _values(build)) == (2, 1, (1, 1))
    done = _gpu_check(tmp_path, out, "use-base", VARIANT_INSTANCES="fattn.cu", VARIANT_NAME="choice")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _call(build, "value_fattn")[0] == 1


def test_pack_carries_each_side_linked_and_a_prebuilt_build_swaps_them(tmp_path: Path):
    """pack keeps the sides the use phases linked; on a machine with only the unpacked archive (no build.ninja,
    no objects) use-variant and use-base copy those libraries in."""
    build = _build_folder(tmp_path)
    (build / "manifest.json").write_text("{}\n")
    (tmp_path / "vendor" / "llama.cpp" / "gguf-py" / "gguf").mkdir(parents=True)
    (tmp_path / "vendor" / "llama.cpp" / "gguf-py" / "gguf" / "__init__.py").write_text("")
    out = tmp_path / "out"
    done = _gpu_check(tmp_path, out, "variant", "use-variant", "use-base", "pack")
    assert done.returncode == 0, done.stdout + done.stderr
    archive = out / "prebuilt.tar.xz"
    names = subprocess.run(["tar", "-tJf", str(archive)], capture_output=True, text=True, check=True).stdout.split()
    rel = str(build)[1:]
    assert sorted(names) == sorted(f"{rel}/{n}" for n in ("manifest.json", LIB, "ab/lib-base.so", "ab/lib-variant.so"))

    gguf_py = subprocess.run(["tar", "-tJf", str(out / "gguf-py.tar.xz")], capture_output=True, text=True, check=True)
    assert "gguf-py/gguf/__init__.py" in gguf_py.stdout.split()

    shutil.rmtree(build)  # the GPU machine: the archive at the build's own path, nothing compiled there
    subprocess.run(["tar", "-C", "/", "-xJf", str(archive)], check=True)
    assert not (build / "build.ninja").exists()
    assert _values(build) == (1, 1)
    done = _gpu_check(tmp_path, out, "use-variant")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _values(build) == (2, 1)
    done = _gpu_check(tmp_path, out, "use-base")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _values(build) == (1, 1)
    done = _gpu_check(tmp_path, out, "use-variant", VARIANT_NAME="never")
    assert done.returncode != 0  # a side that was not packed


def test_sides_of_different_instance_sets_do_not_mix(tmp_path: Path):
    """r11: vec1 swapped fattn.cu, kblock two instances; `use-base` for kblock's set must also put the build's
    fattn.cu back, and `use-variant` of kblock must not keep vec1's."""
    build = _build_folder(tmp_path)
    out = tmp_path / "out"
    both = "turbo3-turbo3 q8_0-turbo3"
    for name, insts in (("vec1", "fattn.cu"), ("kblock", both)):
        done = _gpu_check(tmp_path, out, "variant", VARIANT_INSTANCES=insts, VARIANT_NAME=name)
        assert done.returncode == 0, done.stdout + done.stderr
    done = _gpu_check(tmp_path, out, "use-variant", VARIANT_INSTANCES="fattn.cu", VARIANT_NAME="vec1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (_call(build, "value_fattn")[0], _values(build)) == (2, (1, 1))
    done = _gpu_check(tmp_path, out, "use-variant", VARIANT_INSTANCES=both, VARIANT_NAME="kblock")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (_call(build, "value_fattn")[0], _values(build)) == (1, (2, 2))
    done = _gpu_check(tmp_path, out, "use-variant", VARIANT_INSTANCES="fattn.cu", VARIANT_NAME="vec1")
    assert done.returncode == 0, done.stdout + done.stderr
    done = _gpu_check(tmp_path, out, "use-base", VARIANT_INSTANCES=both, VARIANT_NAME="kblock")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (_call(build, "value_fattn")[0], _values(build)) == (1, (1, 1))
    md5 = {}
    for line in (out / "summary.txt").read_text().splitlines():
        if line.startswith("use "):
            md5.setdefault(line.split()[1].rstrip(":"), set()).add(line.split()[-1])
    assert all(len(sums) == 1 for sums in md5.values()), md5  # each side links to one library, whenever it is used
