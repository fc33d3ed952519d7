"""diffaccel.kit.paygate: the cost gate's phases and verdicts under a fake clock (either verdict
forced), its memory across runs, and the run summary's line."""

from __future__ import annotations

import pytest

from diffaccel.kit.paygate import PIN, PayGate, describe


@pytest.fixture(autouse=True)
def unpinned(monkeypatch):
    """The suite pins every gate on (conftest.py); these tests measure."""
    monkeypatch.delenv(PIN, raising=False)


class FakeClock:
    """Each step lasts ``plain`` seconds when the strategy is aside, ``strategy`` when it acts."""

    def __init__(self, plain: float, strategy: float):
        self.t, self.plain, self.strategy = 0.0, plain, strategy
        self.run = None

    def __call__(self) -> float:
        return self.t

    def step(self) -> None:
        self.t += self.strategy if self.run.active else self.plain


def drive(gate: PayGate, clock: FakeClock, steps: int, key="m") -> list[str]:
    """One run of ``steps`` steps; the phase of each step."""
    run = clock.run = gate.start(key)
    phases = []
    for step in range(steps):
        run.tick(step)
        phases.append(run.phase)
        clock.step()
    run.finish()
    return phases


@pytest.mark.parametrize("strategy_s, on", [(0.5, True), (1.5, False)])
def test_the_verdict_follows_the_timed_steps(strategy_s, on):
    clock = FakeClock(1.0, strategy_s)
    gate = PayGate(plain=3, probe=4, clock=clock)
    phases = drive(gate, clock, 20)
    # step 0 untimed, steps 1-3 plain; step 4 is the strategy's first (untimed), 5-8 probed
    assert phases[:4] == ["plain"] * 4
    assert phases[4:9] == ["probe"] * 5
    assert set(phases[9:]) == {"on" if on else "off"}
    v = gate.verdicts["m"]
    assert v.on is on
    assert v.plain_ms == pytest.approx(1000.0) and v.strategy_ms == pytest.approx(strategy_s * 1000)


def test_a_verdict_is_kept_for_later_runs_of_the_same_key_only():
    clock = FakeClock(1.0, 2.0)
    gate = PayGate(clock=clock)
    drive(gate, clock, 20)
    assert drive(gate, clock, 10) == ["off"] * 10  # no plain or probe steps again
    assert drive(gate, clock, 10, key="other")[0] == "plain"


def test_the_end_of_a_run_corrects_a_verdict_its_probe_made_too_early():
    clock = FakeClock(1.0, 0.5)
    gate = PayGate(clock=clock)
    run = clock.run = gate.start("m")
    for step in range(30):
        run.tick(step)
        if step == 12:
            clock.strategy = 3.0  # the strategy's later steps cost more than plain ones
        clock.step()
    assert run.phase == "on"
    run.finish()
    assert gate.verdicts["m"].on is False  # the next run starts off


def test_fixed_modes_never_measure():
    clock = FakeClock(1.0, 5.0)
    for mode, phase in (("on", "on"), ("off", "off")):
        gate = PayGate(mode=mode, clock=clock)
        assert set(drive(gate, clock, 12)) == {phase}
        assert gate.verdicts == {}
        assert describe("swd", mode, None).startswith(f"swd cost gate: {phase}")


def test_the_environment_pins_an_auto_gate_but_not_an_explicit_mode(monkeypatch):
    clock = FakeClock(1.0, 5.0)
    monkeypatch.setenv(PIN, "on")
    assert set(drive(PayGate(clock=clock), clock, 12)) == {"on"}
    assert set(drive(PayGate(mode="off", clock=clock), clock, 12)) == {"off"}


def test_the_summary_line_says_the_verdict():
    clock = FakeClock(0.010, 0.015)
    gate = PayGate(clock=clock)
    drive(gate, clock, 20)
    v = gate.verdicts["m"]
    assert v.ratio == pytest.approx(1.5)
    assert describe("time-anchor", "auto", v).startswith("time-anchor cost gate: off, full steps")
