"""Client states that scale with the clients that hold one: a mapping client id → `State` whose values live in memory
only from when a round produces them until the next checkpoint, then in one file per client.

- A client never sampled has its initial state, made when asked (`initial(k)`: the method's `init_client_state(k, W₀)`)
  and never written.
- A checkpoint writes the states that changed since the last one, each to its own file (`clients/<k>-<generation>.pt`,
  a new name every time, written atomically), then the checkpoint (which names the files), then removes the files
  it no longer names. A kill at any point leaves the previous checkpoint and the files it names intact. What is
  written per checkpoint grows with the clients sampled since the last one, not with the federation.
- A persisted state is read from its file when asked for (when its client is sampled), so memory holds the states of
  the rounds since the last checkpoint, not every client's.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from pathlib import Path

from flsuite.federation import state_files
from flsuite.federation.task import State


class ClientStates(MutableMapping[int, State]):
    """The phase's clients' states (see the module docstring). As a mapping it holds the clients that have a state of
    their own (sampled at least once, or given); `ids` are all the phase's clients, and a client among them without a
    state of its own gets `initial(k)` when asked for.

    Args:
        ids: The phase's clients.
        initial: A client's state before its first round; None: every client's state is given (`values`).
        values: States held in memory (not yet written).
        files: Client id → its state's file name in `root` (written by an earlier checkpoint).
        root: The folder of the files.
    """

    def __init__(
        self,
        ids: Iterable[int] = (),
        initial: Callable[[int], State] | None = None,
        values: Mapping[int, State] | None = None,
        files: Mapping[int, str] | None = None,
        root: Path | None = None,
    ) -> None:
        self._values: dict[int, State] = dict(values or {})
        self._files: dict[int, str] = dict(files or {})
        self._ids = list(dict.fromkeys([*ids, *self._values, *self._files]))
        self.initial, self.root = initial, root

    def __getitem__(self, client: int) -> State:
        if client in self._values:
            return self._values[client]
        if client in self._files:
            assert self.root is not None, "a state written to a file has a folder"
            return state_files.load(self.root, self._files[client])
        if client not in self._ids:
            raise KeyError(f"client {client} is not a client of this phase (it has {len(self._ids)})")
        if self.initial is None:
            raise KeyError(
                f"client {client} has no state of its own yet (never sampled): "
                "its state is the method's init_client_state"
            )
        return self.initial(client)

    def __setitem__(self, client: int, state: State) -> None:
        if client not in self._values and client not in self._files and client not in self._ids:
            self._ids.append(client)
        self._values[client] = state

    def __delitem__(self, client: int) -> None:
        raise TypeError("a client's state is replaced, never removed")

    def __contains__(self, client: object) -> bool:
        return client in self._values or client in self._files

    def __iter__(self) -> Iterator[int]:
        return iter([k for k in self._ids if k in self])

    def __len__(self) -> int:
        return sum(1 for k in self._ids if k in self)

    @property
    def ids(self) -> list[int]:
        return list(self._ids)

    def in_memory(self) -> int:
        """How many states are held in memory now (changed since the last checkpoint)."""
        return len(self._values)

    def write_changed(self, root: Path, generation: int) -> dict[int, str]:
        """Write every state changed since the last checkpoint to its own file in `root` (atomically, under a name of
        this `generation`); returns the files the checkpoint must name. The states stay in memory until `committed`."""
        root.mkdir(parents=True, exist_ok=True)
        files = dict(self._files)
        if self.root is not None and self.root.resolve() != root.resolve():  # a checkpoint written somewhere new
            for name in files.values():
                shutil.copyfile(self.root / name, root / name)
        for client, state in self._values.items():
            name = f"{client}-{generation}.pt"
            state_files.save(state, root, name)
            files[client] = name
        return files

    def committed(self, root: Path, files: Mapping[int, str]) -> None:
        """The checkpoint naming `files` is written: read the states from there from now on, and remove every file in
        `root` it does not name (earlier versions, and files of a killed run that never reached its checkpoint)."""
        self._files, self._values, self.root = dict(files), {}, root
        state_files.keep_only(root, files.values())
