"""`stopping`: a signal stops the run at once, except inside a checkpoint write."""

import os
import signal
import threading

import pytest

from wmrl_jax.train import stopping


def _signal_self(signum=signal.SIGTERM):
    os.kill(os.getpid(), signum)


def test_a_signal_raises_stopped_with_its_number_and_handlers_are_restored():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(stopping.Stopped) as e:
        with stopping.on_signals():
            _signal_self(signal.SIGTERM)
    assert e.value.signum == signal.SIGTERM and str(e.value) == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


def test_ctrl_c_is_stopped_as_sigint():
    with pytest.raises(stopping.Stopped) as e:
        with stopping.on_signals():
            _signal_self(signal.SIGINT)
    assert e.value.signum == signal.SIGINT


def test_inside_deferred_the_block_finishes_before_the_signal_is_raised():
    done = []
    with pytest.raises(stopping.Stopped):
        with stopping.on_signals():
            with stopping.deferred():
                with stopping.deferred():  # Nested: raised when the outermost ends.
                    _signal_self()
                    done.append("inner")
                done.append("outer")
            done.append("after")  # Not reached: the signal is raised on leaving.
    assert done == ["inner", "outer"]


def test_a_second_signal_is_ignored_during_clean_up():
    cleaned = []
    with pytest.raises(stopping.Stopped):
        with stopping.on_signals():
            try:
                _signal_self(signal.SIGTERM)
            finally:
                _signal_self(signal.SIGINT)  # Would interrupt this clean-up if delivered.
                cleaned.append(True)
    assert cleaned == [True]


def test_deferred_on_another_thread_defers_nothing_and_no_signal_leaks_out():
    seen = []

    def worker():
        with stopping.deferred():
            seen.append("worker")

    with stopping.on_signals():
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        with stopping.deferred():
            pass  # No signal came: leaving raises nothing.
    assert seen == ["worker"]
    assert stopping._State.depth == 0 and stopping._State.pending is None


def test_a_signal_during_a_checkpoint_wait_lets_the_save_finish(tmp_path, monkeypatch):
    import jax.numpy as jnp

    from wmrl_jax.train.checkpoint import Checkpointer

    with stopping.on_signals():
        ckpt = Checkpointer(tmp_path / "ckpt", best_metric=None)
        ckpt.save(1, {"w": jnp.arange(3.0)}, {"note": "one"})
        finished = []
        real_wait = ckpt._manager.wait_until_finished

        def wait_with_a_signal_in_the_middle():
            _signal_self()  # As a preemption arriving while orbax joins its save thread.
            real_wait()
            finished.append(True)

        monkeypatch.setattr(ckpt._manager, "wait_until_finished", wait_with_a_signal_in_the_middle)
        with pytest.raises(stopping.Stopped):
            ckpt.wait()
        assert finished == [True]
        ckpt.close()
    with Checkpointer(tmp_path / "ckpt", best_metric=None) as again:
        assert again.latest_step() == 1 and again.meta(1) == {"note": "one"}
