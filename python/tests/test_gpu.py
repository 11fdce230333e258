"""GPU tests of the Python package (skipped without a CUDA GPU and torch):
torch and CuPy CUDA tensors through channels, the allocator, imported
PyTorch IPC handles, state dicts on the GPU (lent from a module moved
into gpuipc memory, snapshots reusing their segments)."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)
sys.path.insert(0, HERE)
from test_host import _lent_module, _snapshots, procs  # noqa: E402,F401 (procs: a fixture)


def run_pair(env, a, b, dom="g", feed=None, timeout=180):
    def start(role, arg):
        cmd = [sys.executable, os.path.join(HERE, "gpu_peer.py"), role, dom]
        if arg:
            cmd.append(arg)
        return subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    pa, pb = start(*a), start(*b)
    first = None
    if feed is not None:
        first = json.loads(pa.stdout.readline())
        pb.stdin.write(feed(first) + "\n")
        pb.stdin.flush()
    out_b, _ = pb.communicate(timeout=timeout)
    out_a, _ = pa.communicate("\n", timeout=timeout)
    assert pa.returncode == 0 and pb.returncode == 0

    def last(s, before=None):
        # The line a fed process said before it was fed was read above.
        lines = s.strip().splitlines()
        assert lines or before is not None, "the peer printed nothing"
        return json.loads(lines[-1]) if lines else before
    return last(out_a, first), last(out_b)


def test_torch_cuda_tensors_staged(env):
    _, r = run_pair(env, ("torch_send", None), ("torch_recv", None))
    assert r == {"same": [True] * 4}


def test_torch_block_batches(env):
    # five batches of 512 scattered 16 KiB rows of a VMM cache on GPU 0 into
    # scattered rows of one on the last GPU, the indices as a CPU torch
    # tensor, numpy int32, a strided numpy view, a CUDA tensor and a list;
    # every byte checked, the other rows untouched
    s, r = run_pair(env, ("blocks_send", None), ("blocks_recv", None))
    assert r["ok"] == [True] * 5, r
    assert r["untouched"] is True
    assert s["sent"] == 5


def test_torch_tensor_of_1_gib_from_pytorch_allocator_staged(env):
    # larger than any staging slot: one large stage, one copy, every value
    # checked by the receiver against its index
    s, r = run_pair(env, ("large_send", None), ("large_recv", None),
                    timeout=300)
    assert r == {"same": True, "shape": [1 << 28]}
    assert s["bytes"] == 1 << 30 and s["info"] == 1


def test_receive_after_the_peer_closed_and_left(env):
    # the echo closes right after its last send (its events destroyed, its
    # process gone); the last echo must still arrive whole: a stream wait
    # on a destroyed event would wait for ever
    p, e = run_pair(env, ("ping", "300"), ("echo", "300"), timeout=60)
    assert p == {"same": True} and e == {"done": True}


def test_receive_whose_wait_runs_after_the_peer_left(env):
    # the last receive's stream wait is queued behind 0.2 s of GPU work,
    # so the GPU reaches it after the echo destroyed its events and left
    p, e = run_pair(env, ("ping", "40,late"), ("echo", "40"), timeout=60)
    assert p == {"same": True} and e == {"done": True}


def test_torch_allocator_sends_without_staging(env):
    s, r = run_pair(env, ("torch_send", "alloc"), ("torch_recv", None))
    assert r == {"same": [True] * 4}
    assert s["info"] >= 1


def test_cupy_arrays(env):
    pytest.importorskip("cupy")
    _, r = run_pair(env, ("cupy_send", None), ("cupy_recv", None))
    assert r == {"same": [True, True]}


def test_torch_ipc_handle_import(env):
    def feed(first):
        return json.dumps(first["shared"])
    _, r = run_pair(env, ("ipc_export", None), ("ipc_import", None), feed=feed)
    assert r == {"same": True}


def test_state_dict_on_gpu(env):
    def feed(first):
        assert first == {"published": 1}
        return ""
    _, r = run_pair(env, ("sd_publish", None), ("sd_read", None), feed=feed)
    assert r == {"same": True}


def test_state_dict_lent_from_gpuipc_pool(env):
    """Weights born in gpuipc.torch.mem_pool() are lent with no copy, one
    segment per chunk of the pool: the reader sees the publisher's in-place
    writes (ordered by publish), keeps its views from version to version,
    copies into tensors of its own, and a version that moved nothing is
    published with no manifest."""
    env = dict(env)
    pa = subprocess.Popen([sys.executable, os.path.join(HERE, "gpu_peer.py"),
                           "sd_lend_publish", "gl"], env=env, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True)
    pb = subprocess.Popen([sys.executable, os.path.join(HERE, "gpu_peer.py"),
                           "sd_lend_read", "gl"], env=env, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True)
    try:
        first = json.loads(pa.stdout.readline())
        assert first["published"] == 1 and first["lent"] == 9 and first["copied"]
        # the pool cuts its blocks from chunks: one segment per chunk
        assert first["segments"] == first["chunks"] == 1, first
        assert json.loads(pb.stdout.readline()) == {"version": 1, "same": True}
        pa.stdin.write("\n")
        pa.stdin.flush()
        assert json.loads(pa.stdout.readline()) == {"published": 2}
        pb.stdin.write("\n")
        pb.stdin.flush()
        assert json.loads(pb.stdout.readline()) == {
            "version": 2, "big_doubled": True, "lent_view_kept": True,
            "sees_in_place": True, "copied_version": 2, "copy_same": True}
        pa.stdin.write("\n")
        pa.stdin.flush()
        assert json.loads(pa.stdout.readline()) == {"published": [3, 4],
                                                    "manifests": [True, False]}
        pb.stdin.write("\n")
        pb.stdin.flush()
        assert json.loads(pb.stdout.readline()) == {
            "version": 4, "big_quadrupled": True, "same_tensors": True, "other_gone": True}
        pb.communicate(timeout=120)
        pa.communicate("\n", timeout=120)
        assert pa.returncode == 0 and pb.returncode == 0
    finally:
        for p in (pa, pb):
            if p.poll() is None:
                p.kill()


def test_moved_cuda_module_lent_to_a_reader(env, procs):
    """test_host's test_moved_module_lent_to_a_reader on GPU 0: the module's
    CUDA tensors move into one VMM buffer, lent whole to a reader that maps
    it and sees the next optimizer step."""
    _lent_module(env, procs, "cuda")


def test_cuda_snapshots_reuse_their_segments(env, procs):
    """test_host's test_snapshots_reuse_their_segments with the state dict
    on GPU 0: the copies go into VMM segments that later versions reuse,
    versions 6 and 7 behind 1 s of GPU work, which is still running when
    publish returns (the publisher's host does not wait for it); every
    version read whole."""
    _snapshots(env, procs, "cuda")


def test_cuda_snapshots_read_on_another_gpu(env, procs):
    """The same with the reader on GPU 1 (its views mapped there, read by
    GPU 1's streams, the process's current device still 0). Versions 6
    and 7 are published while the publisher's GPU work runs: the reader
    sees their bytes whole only if its stream waited for the publisher's
    event. (Until the manifests were mapped unpinned, registering and
    unregistering them made the publisher's host wait for that work,
    about 1 s each on four H100s.)"""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    _snapshots(env, procs, "cuda1")
