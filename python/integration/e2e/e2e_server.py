"""The end-to-end harness's server scenario: kvtier as an operator runs it,
behind vLLM's OpenAI server, restarted by SIGTERM.

The server commands are read from the README (the tiering recipe, with
the CPU tiering JSON next to it, and the connector's), not copied here, and
started as bash runs them, with the harness's model and a few flags for
its tiny model appended (``HARNESS_FLAGS``). A real OpenAI client (the
``openai`` package) sends six completions: two 640-token prefixes, each
with three short suffixes, in text (a word-level tokenizer saved beside the
model). Six server starts:

- tiering 1, the recipe as written (``--shutdown-timeout``): the
  completions; kvtier's ``vllm:kvtier_*`` figures on ``/metrics`` move
  (stores, lookups, the budget); SIGTERM drains: exit status 0 within the
  timeout, nothing of the server left in /dev/shm;
- tiering 2 to 4, in vLLM's default mode (the recipe without
  ``--shutdown-timeout``): each takes the prompt tokens from kvtier's tier
  (vLLM's own ``vllm:prompt_tokens_by_source``) and gives the same texts;
  SIGTERM aborts the engine, whose offload region stays; the next start
  removes it, so /dev/shm holds the running server's region alone;
- the connector 1 (the recipe as written) and 2 (default mode): the same
  completions, the second served from the connector's files; after the
  third default-mode SIGTERM of tiering, the connector's start leaves no
  offload region at all (it makes none).

Every server's log: no traceback with a frame of kvtier's code (vLLM's
own ``EngineDeadError`` at an aborted, or at times a drained, shutdown is
vLLM's: see docs/verification.md), no ``BufferError``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from e2e_common import check, tail

if TYPE_CHECKING:
    from harness import Harness

README = Path(__file__).resolve().parents[3] / "README.md"
#: Flags the harness appends for its tiny float32 model (the README's
#: command is for a real one): exact float32 outputs, no compilation (a
#: minute per start on this model), a context that holds the prompts.
HARNESS_FLAGS = "--dtype float32 --enforce-eager --max-model-len 2048 --seed 0"
PREFIX_WORDS = 640
#: How long a drained server may take to exit: the recipe's timeout plus
#: what the API server's own teardown takes.
EXIT_SLACK = 15.0
START_TIMEOUT = 300.0
REGION = re.compile(r"vllm_offload_.+\.mmap")


# The README's recipes.


def readme_recipes() -> tuple[str, str, dict]:
    """The tiering server command, the connector's, and the CPU tiering
    JSON they name, as the README gives them."""
    text = README.read_text()
    blocks = re.findall(r"```(\w*)\n(.*?)```", text, re.S)
    servers = [body for lang, body in blocks if lang == "sh" and "vllm.entrypoints.openai.api_server" in body]
    tiering = [s for s in servers if "kv-transfer.json" in s]
    connector = [s for s in servers if "StorageConnector" in s]
    cpu_json = [body for lang, body in blocks if lang == "json" and "CpuTieringSpec" in body]
    check(len(tiering) == 1 and len(connector) == 1, f"the README's server recipes: {servers}")
    check(len(cpu_json) == 1, "the README's CPU tiering JSON")
    return command_of(tiering[0]), command_of(connector[0]), json.loads(cpu_json[0])


def command_of(block: str) -> str:
    """The server's command line in a shell block: the line that starts it
    and its continuations, without comments or other commands."""
    lines = block.splitlines()
    start = next(i for i, line in enumerate(lines) if "vllm.entrypoints.openai.api_server" in line)
    command = []
    for line in lines[start:]:
        command.append(line)
        if not line.rstrip().endswith("\\") and _quotes_closed("\n".join(command)):
            break
    return "\n".join(command)


def _quotes_closed(text: str) -> bool:
    try:
        shlex.split(text)
        return True
    except ValueError:
        return False


def shutdown_timeout(command: str) -> float:
    """The recipe's ``--shutdown-timeout`` (seconds)."""
    found = re.search(r"\s--shutdown-timeout[ =](\d+)", command)
    check(found is not None, f"the recipe sets no --shutdown-timeout: {command}")
    return float(found.group(1))


def default_mode(command: str) -> str:
    """The command in vLLM's default shutdown mode: without its
    ``--shutdown-timeout``."""
    stripped = re.sub(r"\s--shutdown-timeout[ =]\d+", "", command)
    check(stripped != command, f"the recipe sets no --shutdown-timeout: {command}")
    return stripped


# A text tokenizer for the harness's model.


def make_tokenizer(model: Path) -> None:
    """A word-level tokenizer (``w3`` ... ``w8191``) saved beside the
    model, which vLLM's server loads offline."""
    if (model / "tokenizer.json").exists():
        return
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 8192)}}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(model / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "bos_token": "<s>",
              "eos_token": "</s>", "model_max_length": 2048}
    (model / "tokenizer_config.json").write_text(json.dumps(config))


def prompts() -> list[str]:
    import random

    rng = random.Random(11)
    prefixes = [" ".join(f"w{rng.randrange(3, 8000)}" for _ in range(PREFIX_WORDS)) for _ in range(2)]
    return [f"{prefix} w{100 + i} w{200 + i}" for prefix in prefixes for i in range(3)]


# A server.


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def regions() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if REGION.fullmatch(name)}


#: Servers started and not yet stopped (killed if a check fails).
RUNNING: list["Server"] = []


class Server:
    """One server process started from a README command."""

    def __init__(self, h: "Harness", name: str, command: str, model: Path, cwd: Path) -> None:
        h.runs += 1
        self.name = f"{h.runs:02d}-{name}"
        self.port = free_port()
        self.log_path = h.work / "runs" / self.name / "server.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.model = str(model)
        self.command = command
        line = f"{command.replace('MODEL', shlex.quote(self.model))} {HARNESS_FLAGS} --host 127.0.0.1 --port {self.port}"
        (self.log_path.parent / "command.sh").write_text(line + "\n")
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        # `python` in the README's command: the venv's (vLLM's).
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        self.shm_before = set(os.listdir("/dev/shm"))
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            ["bash", "-c", line], cwd=cwd, env=env, stdout=open(self.log_path, "w"),
            stderr=subprocess.STDOUT, start_new_session=True,
        )
        RUNNING.append(self)
        self._wait_up()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _wait_up(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            check(self.process.poll() is None, f"{self.name}: the server exited at start\n{tail(self.log())}")
            try:
                urllib.request.urlopen(self.url("/health"), timeout=2)
                print(f"  {self.name}: up in {time.monotonic() - self.started:.0f} s", flush=True)
                return
            except OSError:
                time.sleep(0.5)
        raise AssertionError(f"{self.name}: not up in {START_TIMEOUT} s\n{tail(self.log())}")

    def complete(self, texts: list[str]) -> list[str]:
        import openai

        client = openai.OpenAI(base_url=self.url("/v1"), api_key="unused", timeout=120, max_retries=0)
        return [
            client.completions.create(
                model=self.model, prompt=text, max_tokens=12, temperature=0, logprobs=1
            ).choices[0].text
            for text in texts
        ]

    def metrics(self) -> dict[str, float]:
        """``/metrics`` summed over labels: ``name`` and ``name{source=...}``
        for vLLM's prompt token sources."""
        out: dict[str, float] = {}
        body = urllib.request.urlopen(self.url("/metrics"), timeout=10).read().decode()
        for line in body.splitlines():
            if line.startswith("#") or " " not in line:
                continue
            series, value = line.rsplit(" ", 1)
            name = series.split("{", 1)[0]
            source = re.search(r'source="(\w+)"', series)
            key = f"{name}{{{source.group(1)}}}" if source and "by_source" in name else name
            out[key] = out.get(key, 0.0) + float(value)
        return out

    def await_metrics(self, what: str, ok, seconds: float = 15.0) -> dict[str, float]:
        """``/metrics`` once ``ok(figures)`` holds (vLLM's figures follow the
        engine's steps)."""
        deadline = time.monotonic() + seconds
        while True:
            figures = self.metrics()
            if ok(figures) or time.monotonic() > deadline:
                check(ok(figures), f"{self.name}: {what}: {kvtier_figures(figures)}")
                return figures
            time.sleep(0.5)

    def stop(self, drains: bool) -> str:
        """SIGTERM; the log once the server and its processes are gone."""
        from e2e_common import wait_for_group

        stopping = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        status = self.process.wait(timeout=120)
        RUNNING.remove(self)
        seconds = time.monotonic() - stopping
        gone = wait_for_group(self.process.pid, timeout=60)
        log = self.log()
        print(f"  {self.name}: stopped in {seconds:.1f} s ({'drained' if drains else 'aborted'})", flush=True)
        check(gone, f"{self.name}: engine processes outlived the server\n{tail(log)}")
        check(status == 0, f"{self.name}: the server exited with {status}\n{tail(log)}")
        check_server_log(self.name, log)
        if drains:
            limit = shutdown_timeout(self.command) + EXIT_SLACK
            check(seconds < limit, f"{self.name}: a drained SIGTERM took {seconds:.1f} s (over {limit:.0f} s)")
            left = set(os.listdir("/dev/shm")) - self.shm_before
            check(not left, f"{self.name}: a drained server left {sorted(left)} in /dev/shm")
        return log


def check_server_log(name: str, log: str) -> None:
    """No traceback with a frame in kvtier's code, and no BufferError."""
    check("BufferError" not in log, f"{name}: BufferError\n{tail(log)}")
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if "Traceback (most recent call last)" not in line:
            continue
        frames = []
        for frame in lines[i + 1:]:
            if "File \"" not in frame and not frame.strip().startswith(("^", "~")) and "    " not in frame:
                break
            frames.append(frame)
        ours = [f for f in frames if re.search(r'File ".*[/\\]kvtier[/\\]', f)]
        check(not ours, f"{name}: a traceback through kvtier's code\n" + "\n".join(lines[i:i + 40]))


def kvtier_figures(figures: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in figures.items() if k.startswith("vllm:kvtier_") and not k.endswith("_created")}


def from_tier(figures: dict[str, float]) -> tuple[float, float]:
    """Prompt tokens vLLM loaded from the KV connector or tier, and computed."""
    return (
        figures.get("vllm:prompt_tokens_by_source_total{external_kv_transfer}", 0.0),
        figures.get("vllm:prompt_tokens_by_source_total{local_compute}", 0.0),
    )


# The scenario.


def run(h: "Harness") -> None:
    try:
        scenario(h)
    finally:
        for server in RUNNING:
            os.killpg(server.process.pid, signal.SIGTERM)
            try:
                server.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.process.pid, signal.SIGKILL)
                server.process.wait()
        RUNNING.clear()


def scenario(h: "Harness") -> None:
    make_tokenizer(h.model)
    tiering, connector, cpu_json = readme_recipes()
    texts = prompts()
    root = h.work / "server-tier"
    roots = {"tiering": root, "connector": h.work / "server-connector"}
    for path in roots.values():
        subprocess.run(["rm", "-rf", str(path)], check=True)
        path.mkdir(parents=True)
    # The README's JSON on the harness's directory (its 1 GiB CPU tier
    # kept), with a budget above the working set, so that the budget's
    # figures show on /metrics too.
    tiers = cpu_json["kv_connector_extra_config"]["secondary_tiers"]
    tiers[0].update(root_dir=str(root / "kv"), capacity_bytes=64 << 20)
    (root / "kv-transfer.json").write_text(json.dumps(cpu_json))
    connector = connector.replace("/mnt/kv", str(roots["connector"] / "kv"))
    check(str(roots["connector"]) in connector, f"the connector's recipe names no /mnt/kv: {connector}")

    # Tiering 1: the recipe as written; figures move; SIGTERM drains.
    server = Server(h, "server-tiering-recipe", tiering, h.model, root)
    before = server.metrics()
    expected = server.complete(texts)
    server.await_metrics(
        "kvtier's store, lookup and budget figures moved",
        lambda f: f.get("vllm:kvtier_store_bytes_total", 0) > before.get("vllm:kvtier_store_bytes_total", 0)
        and f.get("vllm:kvtier_lookup_misses_total", 0) > before.get("vllm:kvtier_lookup_misses_total", 0)
        and f.get("vllm:kvtier_resident_bytes", 0) > 0
        and f.get("vllm:kvtier_lookup_verdict_seconds_count", 0) > 0,
    )
    server.stop(drains=True)
    stored = len(list((root / "kv").rglob("*.bin")))
    check(stored >= 2 * PREFIX_WORDS // 32, f"tiering: {stored} blocks stored by the drained server")

    # Tiering 2-3: vLLM's default mode, aborted at SIGTERM. The second
    # start removes the region the first left, and the connector's start
    # below the second's: two restarts after an abort, each checked. (A
    # third, until issue 43, showed nothing the second does not.)
    leftovers: set[str] = set()
    for i in (2, 3):
        server = Server(h, f"server-tiering-default-{i}", default_mode(tiering), h.model, root)
        running = regions()
        check(not running & leftovers, f"{server.name}: a stopped server's region is still in /dev/shm: {running}")
        check(len(running) == 1, f"{server.name}: /dev/shm holds {sorted(running)}, not the server's region alone")
        if leftovers:
            check("an offload region a stopped vLLM engine left" in server.log(),
                  f"{server.name}: kvtier did not say it removed {leftovers}")
        got = server.complete(texts)
        check(got == expected, f"{server.name}: texts {got} differ from {expected}")
        figures = server.await_metrics(
            "prompt tokens from kvtier's tier, its hits and loads on /metrics",
            lambda f: from_tier(f)[0] >= 2 * PREFIX_WORDS and f.get("vllm:kvtier_load_bytes_total", 0) > 0
            and f.get("vllm:kvtier_lookup_hits_total", 0) > 0,
        )
        loaded, computed = from_tier(figures)
        h.notes.append(f"server: {server.name} loaded {loaded:.0f} prompt tokens from kvtier's tier, computed {computed:.0f}")
        server.stop(drains=False)
        leftovers = regions()
        check(len(leftovers) == 1, f"{server.name}: an aborted server left {sorted(leftovers)} (expected its region)")

    # The connector: its start removes the last aborted server's region.
    croot = roots["connector"]
    server = Server(h, "server-connector-recipe", connector, h.model, croot)
    check(not regions(), f"{server.name}: /dev/shm still holds {sorted(regions())} after two aborted servers")
    got = server.complete(texts)
    check(got == expected, f"{server.name}: texts {got} differ from {expected}")
    server.await_metrics(
        "the connector's store and lookup figures moved",
        lambda f: f.get("vllm:kvtier_store_bytes_total", 0) > 0 and f.get("vllm:kvtier_lookup_misses_total", 0) > 0,
    )
    server.stop(drains=True)
    server = Server(h, "server-connector-default", default_mode(connector), h.model, croot)
    got = server.complete(texts)
    check(got == expected, f"{server.name}: texts {got} differ from {expected}")
    figures = server.await_metrics(
        "prompt tokens from the connector's files",
        lambda f: from_tier(f)[0] >= 2 * PREFIX_WORDS and f.get("vllm:kvtier_lookup_hits_total", 0) > 0,
    )
    h.notes.append(f"server: {server.name} loaded {from_tier(figures)[0]:.0f} prompt tokens from the connector's files")
    server.stop(drains=False)
    check(not regions(), f"{server.name}: the connector left {sorted(regions())} in /dev/shm")
