"""The end-to-end harness's engine runs and its vLLM-tiering scenarios
(restart, cross-read, crash, damage, preemption); e2e.py drives it."""

from __future__ import annotations

import filecmp
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from e2e_common import (
    BLOCK_BYTES,
    HERE,
    LOGPROB_TOLERANCE,
    MAX_TOKENS,
    PREEMPT_BLOCKS,
    PREEMPT_TOKENS,
    PROMPT_TOKENS,
    PROMPTS,
    block_files,
    check,
    check_log,
    kv_drift,
    rank_dir,
    relative_blocks,
    tail,
    temp_files,
    wait_for_group,
)


class Harness:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.model = work / "model"
        rng = random.Random(5)
        self.prompts = [[rng.randrange(1, 8000) for _ in range(PROMPT_TOKENS)] for _ in range(PROMPTS)]
        self.runs = 0
        self.baseline: dict = {}
        self.baseline_seconds = 0.0
        self.notes: list[str] = []

    # Running engines.

    def settings(self, tier, root, **extra) -> dict:
        return {
            "model": str(self.model),
            "prompts": self.prompts,
            "max_tokens": MAX_TOKENS,
            "tier": tier,
            "root": str(root),
            **extra,
        }

    def start(self, name: str, settings: dict):
        self.runs += 1
        run_dir = self.work / "runs" / f"{self.runs:02d}-{name}"
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "settings.json").write_text(json.dumps(settings))
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
        log = open(run_dir / "engine.log", "w")
        process = subprocess.Popen(
            [sys.executable, str(HERE / "engine.py"), str(run_dir / "settings.json"), str(run_dir / "out.json")],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        return process, run_dir

    def run(self, name: str, settings: dict, drive=None) -> dict:
        """One engine process to its end; its output, once checked clean.
        ``drive(process, run_dir)``, if given, runs while the engine does
        (it releases batches held at a ``pause``, say)."""
        shm_before = set(glob.glob("/dev/shm/vllm_offload_*"))
        started = time.monotonic()
        process, run_dir = self.start(name, settings)
        if drive is not None:
            drive(process, run_dir)
        result = self._ended(process, run_dir, started)
        left = set(glob.glob("/dev/shm/vllm_offload_*")) - shm_before
        check(not left, f"{run_dir.name}: offload regions left in /dev/shm: {sorted(left)}")
        return result

    def _ended(self, process, run_dir: Path, started: float) -> dict:
        """Waits for an engine process and its group; its output, once its
        exit status and log are checked clean."""
        status = process.wait(timeout=900)
        # The engine's own processes (engine core, worker) may still be
        # tearing down: the checks below are of what they all leave.
        gone = wait_for_group(process.pid, timeout=120)
        log = (run_dir / "engine.log").read_text()
        check(gone, f"{run_dir.name}: engine processes outlived the engine by 120 s\n{tail(log)}")
        print(f"  {run_dir.name}: {time.monotonic() - started:.0f} s", flush=True)
        check(status == 0, f"{run_dir.name}: the engine exited with {status}\n{tail(log)}")
        check_log(run_dir.name, log)
        result = json.loads((run_dir / "out.json").read_text())
        result["log"] = log
        return result

    def run_together(self, runs: list) -> list:
        """Engine processes started at once that run their prompts together
        (each waits at a barrier until all are up), each to its end; their
        outputs, each checked clean as ``run`` checks one."""
        shm_before = set(glob.glob("/dev/shm/vllm_offload_*"))
        started = time.monotonic()
        barrier = self.work / "runs" / f"barrier-{self.runs + 1:02d}"
        shutil.rmtree(barrier, ignore_errors=True)
        barrier.mkdir(parents=True)
        processes = [self.start(name, dict(settings, barrier=str(barrier))) for name, settings in runs]
        deadline = time.monotonic() + 600
        while len(list(barrier.glob("*.ready"))) < len(runs):
            exited = [p.args for p, _ in processes if p.poll() is not None]
            check(not exited and time.monotonic() < deadline, f"engines run together: not all came up {exited}")
            time.sleep(0.05)
        (barrier / "go").touch()
        results = [self._ended(process, run_dir, started) for process, run_dir in processes]
        left = set(glob.glob("/dev/shm/vllm_offload_*")) - shm_before
        check(not left, f"engines run together: offload regions left in /dev/shm: {sorted(left)}")
        return results

    def kill_once_stored(self, what: str, name: str, root: Path, settings: dict, files: int) -> list[Path]:
        """Starts an engine, kills it (SIGKILL, its process group) as soon as
        ``files`` block files are in ``root``, while the rest are held,
        queued or being written; checks that no partial block is left under
        a block's name, and plants what a writer killed mid-write leaves (a
        temporary file beside a block). Returns the blocks stored."""
        shm_before = set(glob.glob("/dev/shm/*"))
        process, run_dir = self.start(name, settings)
        deadline = time.monotonic() + 600
        while len(block_files(root)) < files and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        check(
            process.poll() is None and bool(block_files(root)),
            f"{what}: nothing stored while it ran\n{tail((run_dir / 'engine.log').read_text())}",
        )
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        wait_for_group(process.pid, timeout=120)
        # A SIGKILL leaves the killed engine's shared memory (its offload
        # region, its processes' queues): nothing of it can unlink them.
        for left in set(glob.glob("/dev/shm/*")) - shm_before:
            os.unlink(left)
        stored = block_files(root)
        partial = [p for p in stored if p.stat().st_size != BLOCK_BYTES]
        check(not partial, f"{what}: partial blocks under a block's name: {partial}")
        leftover = rank_dir(root) / "abc" / "de_g0" / f"abcde{'0' * 59}.bin_{os.getpid()}.tmp"
        leftover.parent.mkdir(parents=True, exist_ok=True)
        leftover.write_bytes(b"\0" * (BLOCK_BYTES // 2))
        return stored

    # What every scenario compares.

    def same_outputs(self, name: str, outputs: dict, only=None) -> None:
        for i, expected in self.baseline.items():
            if only is not None and int(i) not in only:
                continue
            check(i in outputs, f"{name}: prompt {i} produced no output")
            got = {k: v[: len(expected[k])] for k, v in outputs[i].items()}
            check(
                got["tokens"] == expected["tokens"],
                f"{name}: prompt {i} gave tokens {got['tokens']}, without offloading {expected['tokens']}",
            )
            drift = max(abs(a - b) for a, b in zip(got["logprobs"], expected["logprobs"]))
            check(drift <= LOGPROB_TOLERANCE, f"{name}: prompt {i}'s logprobs drift by {drift:.2e}")

    def all_from_tier(self, name: str, result: dict) -> None:
        m = result["metrics"]
        total = PROMPTS * PROMPT_TOKENS
        computed = m.get("vllm:prompt_tokens_by_source{source=local_compute}")
        loaded = m.get("vllm:prompt_tokens_by_source{source=external_kv_transfer}")
        check(
            computed == 0 and loaded == total,
            f"{name}: {computed} prompt tokens computed and {loaded} loaded of {total}: {m}",
        )

    # Scenarios.

    def run_baseline(self) -> None:
        print("baseline: no offloading", flush=True)
        baseline = self.run("baseline", self.settings(None, ""))
        self.baseline = baseline["outputs"]
        self.baseline_seconds = baseline["seconds"]
        check(len(self.baseline) == PROMPTS, "the baseline lost prompts")
        self.notes.append(f"baseline: generate() {baseline['seconds']:.2f} s computing every prompt token")

    def restart(self, tier: str) -> Path:
        root = self.work / f"restart-{tier}"
        shutil.rmtree(root, ignore_errors=True)
        first = self.run(f"restart-{tier}-1", self.settings(tier, root))
        self.same_outputs(f"restart {tier} (process 1)", first["outputs"])
        blocks = block_files(root)
        check(len(blocks) == PROMPTS * PROMPT_TOKENS // 32, f"restart {tier}: {len(blocks)} blocks stored")
        check(all(p.stat().st_size == BLOCK_BYTES for p in blocks), f"restart {tier}: blocks of another size")
        second = self.run(f"restart-{tier}-2", self.settings(tier, root))
        self.all_from_tier(f"restart {tier} (process 2)", second)
        self.same_outputs(f"restart {tier} (process 2)", second["outputs"])
        self.notes.append(
            f"restart {tier}: generate() {first['seconds']:.2f} s storing, {second['seconds']:.2f} s loading"
        )
        return root

    def cross(self) -> None:
        """One engine with both tiers side by side writes the same chunks
        through each: the files must be the same bytes at the same paths
        (two engines cannot be compared so: the CPU kernels' rounding
        varies from run to run, in the last bit). Then each tier serves a
        fresh engine from a copy of the other's directory.

        The offloaded blocks are chunks of two engine blocks: the worker's
        copies enter chunks at an offset (prompts of 18 engine blocks fill
        9 chunks), and kvtier's tier stores, and loads from the other's
        files, blocks of two engine blocks. (Until issue 43 a scenario of
        its own, ``chunks``, ran a restart so; the restart scenario keeps
        chunks of one engine block, and the connector's cross-read has
        vLLM's tier read kvtier's one-block files.)"""
        roots = {tier: self.work / f"cross-written-by-{tier}" for tier in ("kvtier", "vllm")}
        for root in roots.values():
            shutil.rmtree(root, ignore_errors=True)
        chunk = {"offload_block_size": 64}
        written = self.settings("both", "", roots={t: str(r) for t, r in roots.items()}, **chunk)
        both = self.run("cross-both-tiers", written)
        self.same_outputs("cross-read (both tiers)", both["outputs"])
        ours, theirs = roots["kvtier"], roots["vllm"]
        mine, other = relative_blocks(ours), relative_blocks(theirs)
        sizes = {(ours / path).stat().st_size for path in mine}
        check(
            len(mine) == PROMPTS * PROMPT_TOKENS // 64 and sizes == {2 * BLOCK_BYTES},
            f"cross-read: kvtier stored {len(mine)} chunks of sizes {sorted(sizes)}",
        )
        check(mine == other, f"cross-read: the tiers wrote different paths ({len(mine ^ other)} differ)")
        for path in sorted(mine):
            check(filecmp.cmp(ours / path, theirs / path, shallow=False), f"cross-read: {path} differs")
        self.notes.append(f"cross-read: {len(mine)} files of two blocks at the same paths, byte-identical")
        for tier, source in (("kvtier", theirs), ("vllm", ours)):
            root = self.work / f"cross-{tier}"
            shutil.rmtree(root, ignore_errors=True)
            shutil.copytree(source, root)
            result = self.run(f"cross-{tier}-reads-the-other", self.settings(tier, root, **chunk))
            self.all_from_tier(f"cross-read {tier}", result)
            self.same_outputs(f"cross-read {tier}", result["outputs"])

    def crash(self, tier: str) -> None:
        root = self.work / f"crash-{tier}"
        shutil.rmtree(root, ignore_errors=True)
        # Each store job is held 1 s before it reaches the tier, and the
        # engine lingers after its prompts, so stores trickle out.
        settings = self.settings(tier, root, store_delay=1.0, linger=300)
        stored = self.kill_once_stored(f"crash {tier}", f"crash-{tier}-1", root, settings, files=1)
        size = BLOCK_BYTES
        check(len(stored) < PROMPTS * PROMPT_TOKENS // 32, f"crash {tier}: every store finished before the kill")
        temps = temp_files(root)
        # Process 2 is alone on the directory: every temporary file in it is
        # a dead writer's, whatever its age.
        options = {"stale_temp_age": 0} if tier == "kvtier" else {}
        second = self.run(f"crash-{tier}-2", self.settings(tier, root, tier_options=options))
        self.same_outputs(f"crash {tier} (process 2)", second["outputs"])
        check(all(p.stat().st_size == size for p in block_files(root)), f"crash {tier}: a partial block appeared")
        left = temp_files(root)
        if tier == "kvtier":
            check(not left, f"crash {tier}: temporary files not swept: {left}")
        self.notes.append(
            f"crash {tier}: {len(stored)} of {PROMPTS * PROMPT_TOKENS // 32} blocks stored before the kill, "
            f"{len(temps)} temporary files after it (one planted), {len(left)} left after process 2"
        )

    def damage(self, tier: str, source: Path) -> None:
        root = self.work / f"damage-{tier}"
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(source, root)
        blocks = sorted(block_files(root))
        size = BLOCK_BYTES
        victims = {kind: blocks[i] for i, kind in ((5, "truncated"), (23, "emptied"), (47, "directory"), (70, "removed"))}
        originals = {kind: path.read_bytes() for kind, path in victims.items()}
        with open(victims["truncated"], "r+b") as f:
            f.truncate(size // 3)
        victims["emptied"].write_bytes(b"")
        victims["directory"].unlink()
        victims["directory"].mkdir()
        victims["removed"].unlink()
        result = self.run(f"damage-{tier}", self.settings(tier, root))
        self.same_outputs(f"damage {tier}", result["outputs"])
        m = result["metrics"]
        computed = m.get("vllm:prompt_tokens_by_source{source=local_compute}", 0)
        check(computed > 0, f"damage {tier}: nothing was recomputed: {m}")
        for kind in ("truncated", "emptied", "removed"):
            path = victims[kind]
            check(
                path.is_file() and path.stat().st_size == size,
                f"damage {tier}: the {kind} block was not stored whole again",
            )
            # Recomputed, so equal up to the kernels' rounding.
            drift = kv_drift(path.read_bytes(), originals[kind])
            check(drift <= 1e-4, f"damage {tier}: the {kind} block was stored again with other values ({drift})")
        check(victims["directory"].is_dir(), f"damage {tier}: the directory in a block's place was touched")
        self.notes.append(f"damage {tier}: {computed} prompt tokens recomputed of {PROMPTS * PROMPT_TOKENS}")

    def run_preempted(self, name: str, label: str, settings: dict, aborted: set) -> int:
        """Runs `settings` (a KV cache too small for the batch, `aborted`
        requests aborted mid-flight) generating PREEMPT_TOKENS tokens, and
        checks that some request was preempted and that exactly the
        survivors answered, as the baseline did; returns the preemptions."""
        settings["max_tokens"] = PREEMPT_TOKENS
        result = self.run(name, settings)
        preemptions = result["metrics"].get("vllm:num_preemptions", 0)
        check(preemptions > 0, f"{label}: no request was preempted")
        survivors = set(range(PROMPTS)) - aborted
        check(
            set(result["outputs"]) == {str(i) for i in survivors},
            f"{label}: outputs for {sorted(result['outputs'])}",
        )
        self.same_outputs(label, result["outputs"], only=survivors)
        return preemptions

    def preempt(self, tier: str) -> None:
        root = self.work / f"preempt-{tier}"
        shutil.rmtree(root, ignore_errors=True)
        aborted = {1, 4}
        settings = self.settings(tier, root, num_gpu_blocks=PREEMPT_BLOCKS, abort=sorted(aborted))
        preemptions = self.run_preempted(f"preempt-{tier}", f"preempt {tier}", settings, aborted)
        self.notes.append(f"preempt {tier}: {preemptions} preemptions, {len(aborted)} aborted")
