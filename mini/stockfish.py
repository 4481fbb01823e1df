"""Stockfish, the one place every engine call goes through: finding the binary, score conventions
(to_cp, to_pawns, cp_loss), the JSONL caches, and Annotator (MultiPV labels for P:, the eval after a move,
centipawn losses) over a pool of engine processes, with a deadline per call and restart after a crash or a
timeout (Annotator._with_engine).
"""
import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from concurrent.futures import CancelledError, ThreadPoolExecutor

import chess
import chess.engine
from tqdm.auto import tqdm

from mini.flags import not_a_device
from mini.formats import legal_ucis

CP_CAP = 1000  # centipawn losses are clipped here: beyond a piece, how much more was lost says little
BLUNDER_CP = 200  # a move that loses this much is a blunder (chess_eval.py, evaluate.py)
DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "rookworld-mini", "stockfish.jsonl")
MATE_CP = 100000  # to_cp's mate score: mate in n = +-(MATE_CP - n)
MOVE_CACHE_RULE = 2  # move-cache lines of another rule are searched again (1: a mate after the move was one short)
ENGINE_GRACE_S = 10.0  # what an engine call may take beyond its search: a busy machine
HANDSHAKE_S = 10.0  # for an engine to start and answer `uci`
HANDSHAKE_BYTES = 1 << 20  # of its answer read at most: Stockfish 15.1 answers in about 2 KB
ENGINE_TRIES = 3  # a stuck or dying engine is restarted this many times less one, then the run stops


class EngineFailure(RuntimeError):
    """An engine that stopped answering or died ENGINE_TRIES times on one position; the message names both."""


def engine_deadline(limit, multipv=1):
    """Seconds an engine call at `limit` may take before the engine counts as stuck: ENGINE_GRACE_S plus 20
    times a generous guess of the search (the time itself; 100k nodes a second; 1 ms x 1.6^depth, about
    0.1 s at depth 10 and 12 s at depth 20 on one busy core), times the MultiPV lines."""
    guess = limit.time or (limit.nodes / 1e5 if limit.nodes else 1e-3 * 1.6 ** min(limit.depth or 0, 40))
    return ENGINE_GRACE_S + 20 * guess * multipv


class DeadlineEngine(chess.engine.SimpleEngine):
    """SimpleEngine whose every call, searches at a depth or node limit included (python-chess bounds only
    timed ones), raises TimeoutError after `timeout` seconds."""

    def _timeout_for(self, limit):
        return self.timeout


def open_engine(path, deadline):
    """A started DeadlineEngine: HANDSHAKE_S (or the deadline, if longer) for its handshake, then `deadline` for
    every call."""
    # in a process group of its own: a SIGTERM or Ctrl-C sent to the caller's group leaves the engine to the caller,
    # which may still need it to finish a step; it quits when its owner closes it or dies (end of its input)
    engine = DeadlineEngine.popen_uci(path, timeout=max(deadline, HANDSHAKE_S), setpgrp=True)
    engine.timeout = deadline
    engine.protocol.loop.set_exception_handler(quiet_about_dead_engines)
    return engine


def quiet_about_dead_engines(loop, context):
    """The engine thread's asyncio error report, less the engine's death. A search cut off at its start (a kill of
    ours: Ctrl-C, a deadline) fails the caller's call, which handles it, and also a future nobody awaits, which
    asyncio would print as an error with a traceback at exit, after the one-sentence message."""
    if not isinstance(context.get("exception"), chess.engine.EngineTerminatedError):
        loop.default_exception_handler(context)


def find_stockfish(path=""):
    """The Stockfish binary: the given path, else PATH, else Debian's /usr/games/stockfish; checked once per
    process to speak UCI (answer `uci` with `uciok`), so a wrong binary is one sentence, not a hang. Its
    `id name` (Stockfish 15.1) is kept in ENGINE_NAMES."""
    found = shutil.which(path) if path else shutil.which("stockfish") or shutil.which("/usr/games/stockfish")
    if not found:
        where = f"no executable at {path}" if path else "not on PATH nor in /usr/games"
        raise FileNotFoundError(f"Stockfish not found ({where}): install it with `apt-get install stockfish` "
                                "or point --stockfish_path at the binary.")
    if found not in ENGINE_NAMES:
        try:
            answer, returncode = uci_handshake(found)
        except subprocess.TimeoutExpired:
            raise FileNotFoundError(f"{found} did not answer `uci` within {HANDSHAKE_S:.0f} s; point "
                                    "--stockfish_path at a working Stockfish binary") from None
        except OSError as e:
            raise FileNotFoundError(f"{found} cannot be started ({e.strerror}); point --stockfish_path at the "
                                    "Stockfish binary") from None
        if returncode is not None and returncode < 0 and "uciok" not in answer:  # killed while it answered
            raise FileNotFoundError(f"{found} was killed by signal {-returncode} during its `uci` handshake; "
                                    "run again, or point --stockfish_path at a working Stockfish binary")
        if "uciok" not in answer:
            raise FileNotFoundError(f"{found} is not a UCI chess engine (it did not answer `uci` with `uciok`); "
                                    "point --stockfish_path at the Stockfish binary")
        ENGINE_NAMES[found] = next((line[8:].strip() for line in answer.splitlines()
                                    if line.startswith("id name ")), "unnamed engine")
    return found


def uci_handshake(path):
    """(what `path` answers to `uci` then `quit`, up to its `uciok` and at most HANDSHAKE_BYTES, as text; its
    return code, None if it was still running and was killed). Read in bounded chunks: a program that writes
    without end (`yes`) is cut off, not kept in memory for HANDSHAKE_S. TimeoutExpired after HANDSHAKE_S
    without `uciok` or the end of its output; the process is always killed and reaped."""
    proc = subprocess.Popen([path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    answer = bytearray()

    def read():
        while len(answer) < HANDSHAKE_BYTES and b"uciok" not in answer:
            chunk = proc.stdout.read1(1 << 16)
            if not chunk:
                break
            answer.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        try:
            proc.stdin.write(b"uci\nquit\n")
            proc.stdin.close()
        except OSError:  # it exited, or closed its input, without reading: its output says what it is
            pass
        reader.join(HANDSHAKE_S)
        if reader.is_alive():
            raise subprocess.TimeoutExpired(path, HANDSHAKE_S)
        try:  # `quit` ends an engine at once; one cut off at HANDSHAKE_BYTES is still writing
            returncode = proc.wait(timeout=1.0) if len(answer) < HANDSHAKE_BYTES else None
        except subprocess.TimeoutExpired:
            returncode = None
        # errors="replace": a binary that answers in other bytes (gzip, say) is not a UCI engine, not a traceback
        return answer.decode("utf-8", errors="replace"), returncode
    finally:
        proc.kill()  # no-op once it has exited
        proc.wait()
        reader.join(1.0)  # a child it left behind may hold the pipe open: the daemon reader is then abandoned
        if not reader.is_alive():
            proc.stdout.close()


ENGINE_NAMES = {}  # binary -> its UCI `id name`, for the binaries that speak UCI


def is_label(moves, evals):
    """Whether a label cache line's moves and evals are what annotate writes: UCI strings and as many numbers."""
    return (isinstance(moves, list) and isinstance(evals, list) and len(moves) == len(evals)
            and all(isinstance(m, str) for m in moves) and all(type(e) in (int, float) for e in evals))


def to_cp(score):
    """A side-to-move score in centipawns, mate in n = +-(MATE_CP - n): mates dwarf any material count."""
    return score.relative.score(mate_score=MATE_CP)


def to_pawns(score):
    """A side-to-move score in the data's convention: pawns, mate in n = +-(1000 - n/100)."""
    return to_cp(score) / 100


def cp_loss(best_cp, move_cp, cap=CP_CAP):
    """Centipawns lost by a move against the best, clipped to [0, cap]: a search can score a move a little
    above the best (noise), and beyond a piece how much more was lost says little (a mate costs the cap)."""
    return min(cap, max(0, best_cp - move_cp))


def read_jsonl(path, keys=()):
    """The records (dicts holding `keys`) of a JSONL cache; any other line is skipped, to be computed again: one
    cut short by an interrupted run, or damaged bytes."""
    if not path or path == os.devnull or not os.path.exists(path):  # /dev/null: a cache that keeps nothing
        return
    with open(not_a_device(path), encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                r = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                continue
            if isinstance(r, dict) and all(k in r for k in keys):
                yield r


def append_jsonl(path, records):
    """Append records to a JSONL cache, one write per line (O_APPEND keeps concurrent writers' lines whole);
    a cut-off last line is ended first, so that it does not swallow the next record."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a+b") as f:
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")
        for r in records:
            f.write((json.dumps(r) + "\n").encode())
            f.flush()


def close_engine(engine, kill=False):
    """Stop an engine process and its thread: `quit` (bounded by the engine's deadline) unless kill, then
    close, which kills the process if it is still there; never raises, so that no engine is left behind."""
    if engine is None:
        return
    try:
        if not kill:
            engine.quit()
    except Exception:  # dead, stuck (quit timed out) or already closed
        pass
    finally:
        if kill:  # a search cut off by a timeout would make python-chess fail as the process ends, and never stop
            with contextlib.suppress(RuntimeError):  # the engine's thread: drop it first (its loop may be gone)
                engine.protocol.loop.call_soon_threadsafe(_forget_commands, engine.protocol)
        engine.close()


def _forget_commands(protocol):
    protocol.command = protocol.next_command = None


class Annotator:
    """MultiPV Stockfish analysis of many positions with `workers` engine processes and a FEN cache."""

    def __init__(self, stockfish_path="", depth=12, time_s=None, workers=None, cache_path=DEFAULT_CACHE, multipv=5,
                 nodes=None, move_cache_path=""):
        self.path = find_stockfish(stockfish_path)
        # nodes and depth are deterministic with one thread and a cleared hash; time is not
        self.limit = (chess.engine.Limit(time=time_s) if time_s else chess.engine.Limit(nodes=nodes) if nodes
                      else chess.engine.Limit(depth=depth))
        # cached results are valid for this limit and this engine only: another version labels otherwise
        self.tag = f"time={time_s}" if time_s else f"nodes={nodes}" if nodes else f"depth={depth}"
        self.engine = ENGINE_NAMES[self.path]
        self.multipv, self.cache_path, self.cache = multipv, cache_path, {}
        self.workers = workers or os.cpu_count() or 1
        self.idle = queue.Queue()  # engines not in use; None = not started yet
        for _ in range(self.workers):
            self.idle.put(None)
        for r in read_jsonl(cache_path, keys=("fen", "moves", "evals")):
            if not isinstance(r["fen"], str):  # another JSON type where the position goes: a damaged line
                continue
            if not is_label(r["moves"], r["evals"]):  # a hand-edited "x" would reach a reward as a string
                continue
            if r.get("limit") == self.tag and r.get("multipv") == multipv and r.get("engine") == self.engine:
                self.cache[r["fen"]] = (r["moves"], r["evals"])
        self.move_cache_path, self.move_cache, self.move_cache_read = move_cache_path, {}, 0
        self._read_move_cache()
        self.stats = {"hits": 0, "misses": 0, "rejected": 0, "seconds": 0.0}  # of evals_after, cumulative
        self.driver = None  # the background thread of submit(), started on first use
        self.busy = set()  # the engines searching now, which Ctrl-C cuts off (_cut_off_on_ctrl_c)
        self.deadline, self.failed, self.closed = engine_deadline(self.limit, multipv), None, False

    def _start(self):
        engine = open_engine(self.path, self.deadline)
        try:
            engine.configure({"Threads": 1})  # parallelism comes from processes; one thread is deterministic
        except BaseException:
            close_engine(engine, kill=True)
            raise
        return engine

    def _search(self, engine, fen):
        # a new game each time clears the hash, so a result depends on the position only
        infos = engine.analyse(chess.Board(fen), self.limit, multipv=self.multipv, game=object())
        infos = [i for i in infos if i.get("pv")]
        if not infos:
            raise ValueError(f"no legal move to annotate in {fen}")
        return [i["pv"][0].uci() for i in infos], [to_pawns(i["score"]) for i in infos]

    def _with_engine(self, work, fen):
        """work(engine) on an idle engine of the pool: the one engine-call path of every analysis. An engine
        that dies or exceeds its deadline is killed and restarted; after ENGINE_TRIES failures on one position
        an EngineFailure names the engine and the position, and every later call fails at once with it."""
        if self.closed:  # its engines are gone: idle.get() would wait for ever
            raise RuntimeError("this Annotator is closed; make a new one to search again")
        engine = self.idle.get()
        try:
            for _ in range(ENGINE_TRIES):
                if self.failed:
                    raise self.failed
                try:
                    engine = engine or self._start()
                    self.busy.add(engine)
                    if self.failed:  # Ctrl-C came after _cut_off_on_ctrl_c looked at the busy engines: not searched
                        raise self.failed
                    return work(engine)
                except (chess.engine.EngineError, CancelledError, TimeoutError) as e:
                    close_engine(engine, kill=True)
                    engine, why = None, ("stopped answering" if isinstance(e, TimeoutError) else "died"
                                         if isinstance(e, chess.engine.EngineTerminatedError) else f"failed ({e})")
            self.failed = EngineFailure(
                f"{self.engine} ({self.path}) {why} {ENGINE_TRIES} times on {fen} (deadline {self.deadline:.3g} s a "
                "call); check the engine with that position, or point --stockfish_path at a working Stockfish")
            raise self.failed
        finally:
            self.busy.discard(engine)
            self.idle.put(engine)

    @contextlib.contextmanager
    def _cut_off_on_ctrl_c(self):
        """Inside a thread pool's `with`: on Ctrl-C the searches under way are cut off (their engines killed) and
        those queued fail at once, so that the pool's shutdown, which waits for its threads, takes moments, not
        every queued search (minutes at a deep limit)."""
        try:
            yield
        except KeyboardInterrupt:  # failed is set before busy is read, and _with_engine adds before it reads failed
            self.failed = EngineFailure("the searches were interrupted (Ctrl-C); make a new Annotator to search again")
            for engine in list(self.busy):
                with contextlib.suppress(Exception):  # already gone
                    os.kill(engine.transport.get_pid(), signal.SIGKILL)
            raise

    def _analyse(self, fen):
        return self._with_engine(lambda engine: self._search(engine, fen), fen)

    def _move_loss(self, engine, fen, move):
        """(best move, cp of the best move, cp of `move`), side to move's view, from two searches at the
        same limit: the free one, and one restricted to `move` (root_moves), so both scores come from a
        search of the same depth from the same root. A new game each time keeps it a function of the input."""
        board = chess.Board(fen)
        best = engine.analyse(board, self.limit, game=object())
        best_move, best_cp = best["pv"][0].uci(), to_cp(best["score"])
        if move == best_move:
            return best_move, best_cp, best_cp
        played = engine.analyse(board, self.limit, root_moves=[chess.Move.from_uci(move)], game=object())
        return best_move, best_cp, to_cp(played["score"])

    def _loss_record(self, pair, cap):
        fen, move = pair
        board = chess.Board(fen)
        if board.is_game_over():
            raise ValueError(f"no move to judge in a finished position: {fen}")
        if move not in legal_ucis(fen):  # None, not UCI, or illegal: the worst loss, no search needed
            return {"loss": cap, "best": None, "best_cp": None, "move_cp": None}
        best, best_cp, move_cp = self._with_engine(lambda engine: self._move_loss(engine, fen, move), fen)
        # a restricted search can score a move a little above the free one (search noise): no negative loss
        return {"loss": cp_loss(best_cp, move_cp, cap), "best": best, "best_cp": best_cp, "move_cp": move_cp}

    def move_losses(self, pairs, cap=CP_CAP):
        """Centipawn loss of each (fen, move): Stockfish's eval of its best move minus the eval of `move`,
        both for the side to move, clipped to [0, cap] (a mate scores +-100000 cp, so a missed or allowed
        mate costs the cap). A move that is None, not UCI or illegal costs the cap. Returns one dict per
        pair: loss, best (Stockfish's move), best_cp and move_cp (None when the move was not searched)."""
        with ThreadPoolExecutor(self.workers) as pool, self._cut_off_on_ctrl_c(), \
                tqdm(total=len(pairs), desc="move loss", disable=len(pairs) < 100) as bar:
            out = []
            for record in pool.map(lambda pair: self._loss_record(pair, cap), pairs):
                out.append(record)
                bar.update()
        return out

    def _eval_after(self, fen, move):
        """(cp for the mover after `move`, engine seconds); None when the search gives no score."""
        board = chess.Board(fen)
        board.push_uci(move)
        if board.is_checkmate():  # the engine has nothing to search: score the mate in 1 directly
            return MATE_CP - 1, 0.0
        if board.is_game_over():  # stalemate, insufficient material, 75 moves, fivefold: a draw
            return 0, 0.0
        t0 = time.perf_counter()
        # a new game each time clears the hash, so a result depends on the position only
        info = self._with_engine(lambda engine: engine.analyse(board, self.limit, game=object()), fen)
        if "score" not in info:
            return None, time.perf_counter() - t0
        cp = -to_cp(info["score"])  # the engine scores for the opponent
        mated_in = info["score"].relative.mate()
        if mated_in is not None and mated_in < 0:  # the opponent mated in k: the mover mates in k + 1
            cp -= 1
        return cp, time.perf_counter() - t0

    def _read_move_cache(self):
        """Take in the move cache's lines written since the last read, by this process or any other (the
        scoring workers of a run, other runs): the file is the cache they share. A line still being written
        waits for the next read; a cut-off one is skipped; a file shorter than what was read is read again."""
        if not self.move_cache_path or not os.path.exists(self.move_cache_path):
            return
        with open(self.move_cache_path, "rb") as f:
            if os.fstat(f.fileno()).st_size < self.move_cache_read:  # cut back or made anew: its lines are new
                self.move_cache_read = 0
            f.seek(self.move_cache_read)
            chunk = f.read()
        whole = chunk[:chunk.rfind(b"\n") + 1]
        self.move_cache_read += len(whole)
        for line in whole.splitlines():
            try:
                r = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                continue
            if not (isinstance(r, dict) and {"fen", "move"} <= r.keys()):  # damaged bytes: searched again
                continue
            if (r.get("limit") == self.tag and r.get("engine") == self.engine and r.get("rule") == MOVE_CACHE_RULE
                    and "cp" in r and isinstance(r["fen"], str) and isinstance(r["move"], str)
                    and type(r["cp"]) is int):  # to_cp's: a string or a float is a damaged line
                self.move_cache[r["fen"], r["move"]] = r["cp"]

    def evals_after(self, pairs):
        """{(fen, move): eval in centipawns (to_cp) for the side that played `move`, after it} for legal moves
        of valid positions, searched at this Annotator's limit; distinct pairs are searched once, in parallel,
        and cached in memory and in move_cache_path. A position python-chess calls invalid (Stockfish may crash
        on it) maps to None, is counted in stats["rejected"] and not cached; an engine that keeps failing is an
        EngineFailure (_with_engine)."""
        self._read_move_cache()
        todo, out = [], {}
        for pair in dict.fromkeys(pairs):
            if pair in self.move_cache:
                out[pair] = self.move_cache[pair]
                self.stats["hits"] += 1
            elif not chess.Board(pair[0]).is_valid():
                out[pair] = None
                self.stats["rejected"] += 1
            else:
                todo.append(pair)
        with ThreadPoolExecutor(self.workers) as pool, self._cut_off_on_ctrl_c():
            done = list(pool.map(lambda pair: self._eval_after(*pair), todo))
        new = []
        for (fen, move), (cp, seconds) in zip(todo, done):
            out[fen, move] = cp
            self.stats["misses"] += 1
            self.stats["seconds"] += seconds
            if cp is None:
                self.stats["rejected"] += 1
            else:
                self.move_cache[fen, move] = cp
                new.append({"fen": fen, "move": move, "limit": self.tag, "engine": self.engine, "rule": MOVE_CACHE_RULE,
                            "cp": cp})
        if new and self.move_cache_path:
            append_jsonl(self.move_cache_path, new)
        return out

    def annotate(self, fens):
        """{fen: (moves ranked PV1 first, evals)} for the given FENs."""
        todo = [f for f in dict.fromkeys(fens) if f not in self.cache]
        with ThreadPoolExecutor(self.workers) as pool, self._cut_off_on_ctrl_c(), \
                tqdm(total=len(todo), desc="stockfish", disable=len(todo) < 100) as bar:
            for fen, (moves, evals) in zip(todo, pool.map(self._analyse, todo)):
                self.cache[fen] = (moves, evals)
                if self.cache_path:  # line by line, so that an interrupted run keeps what it computed
                    append_jsonl(self.cache_path, [{"fen": fen, "limit": self.tag, "engine": self.engine,
                                                    "multipv": self.multipv, "moves": moves, "evals": evals}])
                bar.update()
        return {f: self.cache[f] for f in fens}

    def submit(self, fens):
        """annotate(fens) in a background thread, in chunks of 8 per worker: one future per FEN, whose result is
        the {fen: label} of its chunk. Chunks, so that close() waits for one chunk, not the whole list; a
        thread suffices because the search runs in the engines' own processes."""
        if self.driver is None:
            self.driver = ThreadPoolExecutor(1, thread_name_prefix="annotate")
        n = 8 * self.workers
        chunks = [self.driver.submit(self.annotate, fens[i:i + n]) for i in range(0, len(fens), n)]
        return [chunks[i // n] for i in range(len(fens))]

    def close(self):
        if self.driver is not None:
            self.driver.shutdown(wait=True, cancel_futures=True)  # the chunk being searched finishes (and is cached)
        self.closed = True
        while not self.idle.empty():
            close_engine(self.idle.get(), kill=self.failed is not None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
