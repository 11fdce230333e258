"""examples/python/rl_weight_sync.py: its flags work anywhere; on a CUDA
machine with transformers, a tiny model synced to two workers gives the
workers the trainer's logits bit for bit (skipped otherwise)."""
import importlib.util
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "python", "rl_weight_sync.py")


def run(env, *args, timeout=60):
    return subprocess.run([sys.executable, EXAMPLE, *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_help_needs_no_torch_or_transformers(env, tmp_path):
    # transformers (and torch) are imported only after the flags are read:
    # packages that fail to import do not stop --help
    for mod in ("torch", "transformers"):
        (tmp_path / mod).mkdir()
        (tmp_path / mod / "__init__.py").write_text(f"raise ImportError('{mod} hidden')\n")
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env["PYTHONPATH"]
    p = run(env, "--help")
    assert p.returncode == 0, p.stderr
    assert "--workers" in p.stdout and "--worker-gpus" in p.stdout
    assert "--no-baseline" in p.stdout and "--share" in p.stdout


def test_bad_flags_are_refused_before_any_work(env):
    p = run(env, "--workers", "3", "--worker-gpus", "1,2")
    assert p.returncode == 2
    assert "--worker-gpus names 2 GPUs for 3 workers" in p.stderr
    p = run(env, "--worker-gpus", "a,b")
    assert p.returncode == 2 and "not a comma-separated list" in p.stderr
    p = run(env, "--workers", "0")
    assert p.returncode == 2 and "--workers must be at least 1" in p.stderr
    p = run(env, "--reply-timeout", "0")
    assert p.returncode == 2 and "--reply-timeout must be positive" in p.stderr


def test_missing_transformers_is_a_clear_error(env, tmp_path):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("no torch: the example stops at that first")
    (tmp_path / "transformers").mkdir()
    (tmp_path / "transformers" / "__init__.py").write_text(
        "raise ImportError('transformers hidden')\n")
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env["PYTHONPATH"]
    p = run(env)
    assert p.returncode == 2
    assert "needs" in p.stderr and "hidden" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def _gpu_ready():
    try:
        import torch
    except ImportError:
        return "no torch"
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    if importlib.util.find_spec("transformers") is None:
        return "no transformers"
    return None


@pytest.mark.skipif(_gpu_ready() is not None, reason=str(_gpu_ready()))
def test_two_workers_get_the_trainers_logits(env):
    import torch
    n = torch.cuda.device_count()
    # on the trainer's GPU and on another one when there is one; NCCL's
    # baseline runs only when no two processes share a GPU
    gpus = "1,2" if n >= 3 else ("0,1" if n == 2 else "0,0")
    # a worker that does not answer within 100 s fails the run, every
    # process printing its stacks, well inside ctest's 300 s
    p = run(env, "--size", "tiny", "--workers", "2", "--steps", "3", "--reply-timeout", "100",
            "--trainer-gpu", "0", "--worker-gpus", gpus, timeout=250)
    print(p.stdout, p.stderr)
    assert p.returncode == 0, p.stderr
    assert "OK: after each of 3 syncs, every worker's logits equalled the trainer's bit " \
           "for bit" in p.stdout
    rows = {line.split()[0]: line.split()[1:] for line in p.stdout.splitlines()
            if line.startswith(("gpuipc ", "nccl_per_tensor "))}
    assert float(rows["gpuipc"][0]) > 0 and rows["gpuipc"][2] == "1.00"
    if n >= 3:
        assert float(rows["nccl_per_tensor"][0]) > 0
    else:
        assert rows["nccl_per_tensor"] == ["skipped"]
        assert "baseline skipped" in p.stdout


@pytest.mark.skipif(_gpu_ready() is not None, reason=str(_gpu_ready()))
def test_two_workers_under_expandable_segments(env):
    # as verl, SGLang and vLLM run PyTorch: the model is made in expandable
    # segments, moved into gpuipc memory, and the workers' own weights (the
    # copies' targets) stay in expandable segments
    import torch
    gpus = "0,1" if torch.cuda.device_count() >= 2 else "0,0"
    env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    p = run(env, "--size", "tiny", "--workers", "2", "--steps", "3", "--no-baseline",
            "--reply-timeout", "100", "--trainer-gpu", "0", "--worker-gpus", gpus,
            timeout=250)
    print(p.stdout, p.stderr)
    assert p.returncode == 0, p.stderr
    assert "every worker's logits equalled the trainer's bit for bit" in p.stdout


@pytest.mark.skipif(_gpu_ready() is not None, reason=str(_gpu_ready()))
def test_two_workers_sharing_the_copying(env):
    # the workers' models moved into gpuipc memory, each sync one
    # Reader.copy_into(share=True) round between them
    import torch
    gpus = "1,2" if torch.cuda.device_count() >= 3 else "0,0"
    p = run(env, "--size", "tiny", "--workers", "2", "--steps", "3", "--share",
            "--no-baseline", "--reply-timeout", "100", "--trainer-gpu", "0",
            "--worker-gpus", gpus, timeout=250)
    print(p.stdout, p.stderr)
    assert p.returncode == 0, p.stderr
    assert "every worker's logits equalled the trainer's bit for bit" in p.stdout
