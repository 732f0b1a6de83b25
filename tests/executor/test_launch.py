"""tensoropt.launch: the one launcher. Standalone launches share torchrun's rendezvous store (bound
to port 0 and kept), so launches at the same moment do not race for a port."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from tensoropt.launch import LaunchOptions, launch_module, restarts_possible

HERE = Path(__file__).resolve().parent


def test_only_launches_that_may_restart_get_a_store_per_round():
    assert not restarts_possible(LaunchOptions(2))
    assert restarts_possible(LaunchOptions(2, max_restarts=2))
    assert restarts_possible(LaunchOptions(2, nnodes="1:2", rdzv_endpoint="127.0.0.1:29400"))


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_two_launches_at_once_each_form_their_own_group(tmp_path):
    outs = [tmp_path / "a", tmp_path / "b"]
    codes: dict[int, int] = {}

    def launch(i: int) -> None:
        outs[i].mkdir()
        codes[i] = launch_module("launch_probe", [str(outs[i])], LaunchOptions(2, timeout_s=240),
                                 env={"PYTHONPATH": str(HERE)})

    threads = [threading.Thread(target=launch, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=280)
    assert codes == {0: 0, 1: 0}
    ports = set()
    for out in outs:
        ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
        assert [r["sum"] for r in ranks] == [3.0, 3.0] and {r["world_size"] for r in ranks} == {2}
        assert all(r["shared_store"] for r in ranks)  # the workers joined the rendezvous' own store
        ports |= {r["master_port"] for r in ranks}
    assert len(ports) == 2  # one store (one port) per launch
