"""coordinator.peercheck against fake peers: what each answer (or none) does to the node's routing."""

import asyncio

import pytest

import coordinator.peercheck as peercheck
from coordinator.cluster import Node
from coordinator.config import Config
from coordinator.peercheck import PeerCheck, PeerView, expected_view

NODES = (Node(0, "127.0.0.1", 29331), Node(1, "127.0.0.1", 29332))


def node0() -> Config:
    return Config(offsets_partitions=4, cluster=NODES, node_id=0, port=29331, advertised_host="127.0.0.1",
                  advertised_port=29331)


class Peer:
    """Node 1 as node 0 asks it: ``answer`` is returned (a view) or raised (an exception)."""

    def __init__(self, answer: PeerView | BaseException) -> None:
        self.answer = answer

    async def __call__(self, node: Node) -> PeerView:
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


async def test_a_disagreeing_peer_that_stops_answering_no_longer_holds_the_node_back() -> None:
    """README: 'while a peer that answers disagrees ... it coordinates no group'; 'a peer that does not
    answer is no disagreement'. Once the misconfigured peer is stopped, every peer that answers agrees."""
    routed: list[bool] = []
    peer = Peer(PeerView({*NODES, Node(2, "127.0.0.1", 29333)}, {}))
    check = PeerCheck(node0(), routed.append, peer)
    await check.check()
    assert routed == [False] or not check.agreed
    peer.answer = ConnectionRefusedError(111, "Connect call failed")  # the misconfigured node is stopped
    await check.check()
    assert check.agreed, f"still withheld over a peer that no longer answers: {check.disputes}"


async def test_an_answer_the_comparison_cannot_handle_does_not_end_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer that decodes but breaks ``difference`` (a broker named twice, once with a null host, as a
    garbage-speaking peer may send) raised out of ``check`` and ended ``run`` for good: the node stayed
    withheld (its first round never ended) with no line saying why."""
    monkeypatch.setattr(peercheck, "CHECK_INTERVAL_S", 0.01)
    routed: list[bool] = []
    peer = Peer(PeerView({Node(0, None, 29331), Node(0, "127.0.0.1", 29331)}, {}))  # type: ignore[arg-type]
    check = PeerCheck(node0(), routed.append, peer)
    task = asyncio.ensure_future(check.run())
    await asyncio.sleep(0.1)
    peer.answer = expected_view(node0())  # the peer answers properly now
    await asyncio.sleep(0.1)
    try:
        assert not task.done(), f"the check ended: {task.exception()!r}"
        assert check.agreed and routed[-1:] == [True]
    finally:
        task.cancel()
