"""A real-engine regime records whether the engine measured the recompute cost its description
names: the tiny model is cheap on a CPU with AVX-512 (10.9 decode steps per recompute) and dear
on one without (37.6 on 2026-12-07), and a file of the second must not read as the first."""

from __future__ import annotations

from pathlib import Path

from thunder_mw.benchmarks import vllm_real

CHEAP, DEAR = vllm_real.REGIMES["cheap"], vllm_real.REGIMES["dear"]


def test_the_regimes_bands_meet_and_hold_the_measurements_the_targets_were_set_on() -> None:
    assert vllm_real.as_described(CHEAP, 10.9) and not vllm_real.as_described(CHEAP, 37.6)
    assert vllm_real.as_described(DEAR, 38.9) and not vllm_real.as_described(DEAR, 10.9)
    # The bands meet: no measurement falls in both, none in neither.
    assert CHEAP.steps_per_recompute[1] == DEAR.steps_per_recompute[0]


def test_the_cpus_vector_extensions_are_read_from_its_flags(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 avx512f avx512_bf16 amx_tile\n\n"
        "processor\t: 1\nflags\t\t: fpu sse2 avx avx2 avx512f avx512_bf16 amx_tile\n"
    )
    assert vllm_real.cpu_vector_extensions(cpuinfo) == [
        "amx_tile",
        "avx",
        "avx2",
        "avx512_bf16",
        "avx512f",
    ]
    assert vllm_real.cpu_vector_extensions(tmp_path / "absent") == []


def test_a_regime_not_as_described_says_so_in_the_report() -> None:
    report = {
        "regimes": {
            "cheap": {
                "decode_steps_per_recompute": 37.6,
                "as_described": False,
                "description": CHEAP.description,
                "config": {"contexts_over_kv": 2.5},
                "agreement": {"rows": [], "same_ranking": True},
                "policies": {},
                "targets": [],
            }
        }
    }
    assert "NOT the regime described" in vllm_real.format_report(report)
