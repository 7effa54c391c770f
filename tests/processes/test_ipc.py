"""The parent-worker channel: messages of any size, in order, never dropped when the socket
is full, fds passed with their message and closed by the sender once sent."""

import asyncio
import os
import socket

import pytest

from broker.shared import ipc


def pair():
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    return left, right


def test_a_message_far_larger_than_a_datagram_arrives_whole():
    left, right = pair()
    sender, receiver = ipc.Channel(left), ipc.Channel(right)
    frame = os.urandom(5 << 20)
    request = ipc.ForwardedRequest(request_id=7, listener=0, peer="p", frame=frame)
    done = []

    import threading

    reader = threading.Thread(target=lambda: done.append(receiver.receive()))
    reader.start()
    sender.send(request)
    reader.join(10)
    message, fds = done[0]
    assert message == request and fds == []
    sender.close()
    receiver.close()


def test_a_full_socket_queues_in_order_and_drains_when_writable():
    async def run():
        loop = asyncio.get_running_loop()
        left, right = pair()
        sender = ipc.Channel(left, loop)
        receiver = ipc.Channel(right, loop)
        sent = [ipc.Progress(registered=n, closed=list(range(n % 50))) for n in range(3000)]
        for message in sent:  # far more than the socket buffer holds
            sender.send(message)
        assert sender.pending() > 0  # some wait for the socket
        got = []
        while len(got) < len(sent):
            try:
                got.append(receiver.receive()[0])
            except BlockingIOError:
                await asyncio.sleep(0.001)
        assert got == sent and sender.pending() == 0
        sender.close()
        receiver.close()

    asyncio.run(run())


def test_fds_travel_with_their_message_and_the_sender_closes_its_copies():
    left, right = pair()
    sender, receiver = ipc.Channel(left), ipc.Channel(right)
    read_end, write_end = os.pipe()
    sender.send(ipc.Handoff([ipc.HandedOff(1, 0, "127.0.0.1", 9)]), [write_end])
    with pytest.raises(OSError):
        os.fstat(write_end)  # the channel closed the parent's copy once sent
    message, fds = receiver.receive()
    assert message.conns == [ipc.HandedOff(1, 0, "127.0.0.1", 9)] and len(fds) == 1
    os.write(fds[0], b"x")
    assert os.read(read_end, 1) == b"x"
    for fd in (fds[0], read_end):
        os.close(fd)
    sender.close()
    receiver.close()


def test_a_closed_channel_refuses_to_send_and_closes_the_fds_it_was_given():
    left, right = pair()
    sender = ipc.Channel(left)
    right.close()
    read_end, write_end = os.pipe()
    with pytest.raises(ipc.ChannelError):
        sender.send(ipc.Handoff([ipc.HandedOff(1, 0, "h", 1)]), [write_end])
    with pytest.raises(OSError):
        os.fstat(write_end)
    with pytest.raises(ipc.ChannelError):
        sender.send(ipc.Progress(registered=1, closed=[]))
    os.close(read_end)
    sender.close()


def test_garbage_from_the_peer_is_refused_not_raised_as_anything_else():
    left, right = pair()
    receiver = ipc.Channel(right)
    left.send(b"\x00\xc1")  # a whole message whose msgpack is invalid
    with pytest.raises(ValueError):  # msgspec.DecodeError is a ValueError
        receiver.receive()
    left.send(b"\x07junk")  # an unknown datagram flag
    with pytest.raises(ipc.ChannelError):
        receiver.receive()
    left.close()
    receiver.close()
