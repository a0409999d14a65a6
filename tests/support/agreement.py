"""How close CI holds the simulator to the real vLLM CPU engine in the short form of
`bench --scenario vllm-cpu-real` (tests/real/test_bench_vllm_real.py), and so how wrong a
simulator those tolerances catch (tests/unit/test_vllm_real_agreement.py).

Plain vLLM's simulated steps/min must lie within its real runs' range widened by
CI_STEPS_TOLERANCE; every other system's simulated steps/min over plain vLLM's within the
range of the paired real ratios (a repeat's two runs go back to back), widened alike; each
system's simulated prefix hit rate within its runs' range widened by CI_HIT_RATE_TOLERANCE
(absolute) (vllm_real.disagreements). The short form's runs last a second or two, so a burst
of other work on the machine moves one by a third or more: the spread of five interleaved
runs, with the profile fitted on the engine just before them, is what a verdict can rest on.

Measured (2026-12-04, six short forms on this machine and one CI run): plain vLLM's simulated
figure 0.99-1.19x its real median. thunder-mw's simulated figure against its own real runs
moved with the machine: 0.92-1.09x their best on a busy machine, 1.40x on a quiet one (CI: the
engine ran plain vLLM at 1,283 steps/min and thunder-mw at 735-931) - a check of absolute
figures failed on the machine's load, not on the simulator. Over plain vLLM's, run by run, the
simulated ratio is 0.81-0.98x the best real pair's. thunder-mw's hit rate varies 0.45-0.68
between runs of one short form as its holds land on other calls. A simulator whose steps cost
twice what it models lands at about half the real figure, below even the widened range of the
committed runs; one that caches no prefix misses the hit rate by far more than 0.15, and a
gateway simulated as holding nothing by 0.21 below the lowest of the runs committed on
2026-12-05 morning (tests/support/vllm-cpu-real-cheap-2026-12-05.json; on a rerun whose
thunder-mw runs spread wider, by less than the tolerance: tests/unit/test_vllm_real_agreement.py).
"""

CI_STEPS_TOLERANCE = 0.3
CI_HIT_RATE_TOLERANCE = 0.15
