"""FedEGG's guiding sets D^g: public classes chosen from a class-mapping file by a deterministic rule, as a data source.

The mapping file and the selection rule (spec A6: LH, MH, HH) are `flsuite.data.guiding_selection`; here the data
sources, `GuidingSet` (the chosen classes of its sources) and `ClassFolder` (labelled public images by folder), and
`fl_labels` (the FL label of each guiding label, for FedEGG's `shared_head`).

A public class is "<source>/<class>" (a key of `GuidingSet.sources` and one of that source's class names) or, with a
single source, just the class name (e.g. an ImageNet WNID).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from flsuite.data.base import ClientData, DataError, DataSource, FederatedData, Split
from flsuite.data.guiding_selection import Level, chosen_for, load_mapping, select_classes
from flsuite.seeding import numpy_rng


def fl_labels(guiding: FederatedData, fl_classes: Sequence[str]) -> torch.Tensor:
    """The FL label of every guiding label (shared_head): the FL class the `GuidingSet` chose each guiding class for
    (`description["fl_classes"]`), as an index into the federation's `fl_classes`."""
    chosen_for = guiding.description.get("fl_classes")
    if not isinstance(chosen_for, list) or len(chosen_for) != guiding.num_classes:
        raise DataError(
            "FedEGG shared_head: the guiding data does not say which FL class each guiding class stands for "
            "(a GuidingSet records it in description['fl_classes']); use a GuidingSet or shared_head: false"
        )
    unmapped = [g for g, fl in zip(guiding.classes, chosen_for) if fl is None]
    if unmapped:
        raise DataError(
            f"FedEGG shared_head: guiding classes {unmapped} were chosen for no FL class "
            "(the unrelated classes of MH/HH); "
            "shared_head needs every guiding class mapped (LH), or use shared_head: false"
        )
    unknown = sorted({fl for fl in chosen_for if fl not in fl_classes})
    if unknown:
        raise DataError(
            f"FedEGG shared_head: the mapping's FL classes {unknown} "
            f"are not classes of the federation's data {list(fl_classes)}"
        )
    return torch.tensor([list(fl_classes).index(fl) for fl in chosen_for])


class GuidingSet(DataSource):
    """A guiding set: the selected public classes of `sources`, relabelled 0..G−1 in selection order, as one client
    (pooled training samples of every source client) and a test split (the sources' test samples of those classes);
    `description["fl_classes"]` names, per guiding label, the FL class it was chosen for (`chosen_for`; None for an
    unrelated class), which FedEGG's `shared_head` maps labels through.
    Use it as FedEGG's `data: {source: <this>}`; the sources must live in the federation's input space (the same
    frozen encoder and preprocessing).

    Args:
        mapping: The class-mapping JSON file (see `flsuite.data.guiding_selection`).
        level: "LH", "MH" or "HH" (A6).
        sources: Public data by name, e.g. {usps: <Benchmark>, fashion: <Benchmark>}.
        pool: Unrelated-class pool for MH/HH ("<source>" = all its classes, or "<source>/<class>"); null = every
            source class not in LH.
        per_class: Ranks taken per FL class (2: the paper's 20 classes for CIFAR-10).
        size: Keep a seeded `size` of the related classes (CIFAR-100: 40); null = all.
        hh_size: Classes of HH; null = as many as LH.
        max_per_class: At most this many training samples per guiding class (a seeded subset); null = all.
        seed: Seed of the random choices and of the sources' builds: the guiding set is public data, the same for every
            run seed (`build`'s seed is not used).
    """

    def __init__(
        self,
        mapping: Path,
        level: Level,
        sources: dict[str, DataSource],
        pool: list[str] | None = None,
        per_class: int = 2,
        size: int | None = None,
        hh_size: int | None = None,
        max_per_class: int | None = None,
        seed: int = 0,
    ) -> None:
        if not sources:
            raise DataError("GuidingSet needs at least one source")
        self.mapping, self.level, self.sources, self.pool = Path(mapping), level, dict(sources), pool
        self.per_class, self.size, self.hh_size, self.max_per_class, self.seed = (
            per_class,
            size,
            hh_size,
            max_per_class,
            seed,
        )

    def _resolve(self, public: str, classes: Mapping[str, Sequence[str]]) -> tuple[str, str]:
        """(source, class name) of a public class id."""
        name, _, rest = public.partition("/")
        if name in classes and rest:
            source, cls = name, rest
        elif len(classes) == 1:
            source, cls = next(iter(classes)), public
        else:
            raise DataError(
                f"guiding class {public!r}: with several sources, write '<source>/<class>' ({sorted(classes)})"
            )
        if cls not in classes[source]:
            raise DataError(
                f"guiding class {public!r}: source {source!r} has no class {cls!r} "
                f"(it has {list(classes[source])[:12]}...)"
            )
        return source, cls

    def classes_for(self, classes: Mapping[str, Sequence[str]]) -> list[str]:
        """The selected public classes, given every source's class names (the pool expanded from them)."""
        single = len(classes) == 1

        def every(name: str) -> list[str]:
            return [c if single else f"{name}/{c}" for c in classes[name]]

        entries = list(classes) if self.pool is None else self.pool
        pool = [p for e in entries for p in (every(e) if e in classes else [e])]
        return select_classes(
            load_mapping(self.mapping), self.level, pool, self.seed, self.per_class, self.size, self.hh_size
        )

    def build(self, seed: int) -> FederatedData:
        # Public data: built with this set's own seed, the same for every run seed. A `ClassFolder` source (ImageNet)
        # is listed first and decodes only the chosen classes.
        built = {n: s.build(self.seed) for n, s in self.sources.items() if not isinstance(s, ClassFolder)}
        names = {n: list(built[n].classes) if n in built else s.class_names() for n, s in self.sources.items()}  # type: ignore[attr-defined]
        chosen = self.classes_for(names)
        resolved = [self._resolve(p, names) for p in chosen]
        for n, s in self.sources.items():
            if n not in built:
                built[n] = s.build_classes(sorted({c for src, c in resolved if src == n}), self.seed)  # type: ignore[attr-defined]
        rng = numpy_rng(self.seed, purpose="guiding/samples")
        train_x, train_y, test_x, test_y = [], [], [], []
        for label, (public, (source, name)) in enumerate(zip(chosen, resolved)):
            data, cls = built[source], list(built[source].classes).index(name)
            train = Split(torch.cat([c.train.x for c in data.clients]), torch.cat([c.train.y for c in data.clients]))
            rows = torch.nonzero(train.y == cls).flatten()
            if len(rows) == 0:
                raise DataError(f"guiding class {public!r} has no training samples in source {source!r}")
            if self.max_per_class is not None and len(rows) > self.max_per_class:
                rows = rows[torch.from_numpy(rng.choice(len(rows), self.max_per_class, replace=False)).sort().values]
            train_x.append(train.x[rows])
            train_y.append(torch.full((len(rows),), label))
            for split in data.test.values():
                mask = split.y == cls
                test_x.append(split.x[mask])
                test_y.append(torch.full((int(mask.sum()),), label))
        train = Split(torch.cat(train_x), torch.cat(train_y))
        test = Split(torch.cat(test_x), torch.cat(test_y))
        test_splits = {"guiding": test} if len(test) else {"guiding": train}
        mapping = load_mapping(self.mapping)
        description: dict[str, object] = {
            "source": "guiding set",
            "level": self.level,
            "classes": chosen,
            "fl_classes": [chosen_for(mapping, p) for p in chosen],
        }
        return FederatedData(
            [ClientData(0, "guiding", train)],
            test_splits,
            num_classes=len(chosen),
            classes=tuple(chosen),
            description=description,
        )


class ClassFolder(DataSource):
    """Labelled public images as `<root>/<class>/<image>` (e.g. ImageNet-1k's `train` folder, one folder per WNID),
    as pixels in [0, 1]. In a `GuidingSet`, only the chosen classes are decoded (`build_classes`).

    Args:
        root: The folder of class folders (relative: under $FLSUITE_DATA).
        image_size: Side length images are resized to (the FL input size, A15).
        channels: 1 or 3.
        max_per_class: Decode at most this many images per class (a seeded subset); null = all.
        test_fraction: Held-out fraction per class (seeded).
    """

    def __init__(
        self,
        root: Path,
        image_size: int = 32,
        channels: int = 3,
        max_per_class: int | None = 300,
        test_fraction: float = 0.1,
    ) -> None:
        self.root, self.image_size, self.channels, self.max_per_class, self.test_fraction = (
            Path(root),
            image_size,
            channels,
            max_per_class,
            test_fraction,
        )

    def _root(self) -> Path:
        from flsuite.paths import data_path

        root = data_path(self.root)
        if not root.is_dir():
            raise DataError(f"ClassFolder: {root} is not a folder of class folders")
        return root

    def class_names(self) -> list[str]:
        return sorted(d.name for d in self._root().iterdir() if d.is_dir() and not d.name.startswith("."))

    def build(self, seed: int) -> FederatedData:
        return self.build_classes(self.class_names(), seed)

    def build_classes(self, names: Sequence[str], seed: int) -> FederatedData:
        from flsuite.data import image_folder as imf
        from flsuite.data.benchmarks import to_pixels

        root, rng = self._root(), numpy_rng(seed, purpose="guiding/class_folder")
        entries = imf.scan_image_folder(root.parent, [root.name], list(names))[root.name]
        train, test = [], []
        for k in range(len(names)):
            own = [e for e in entries if e[1] == k]
            if self.max_per_class is not None and len(own) > self.max_per_class:
                own = [own[i] for i in sorted(rng.choice(len(own), self.max_per_class, replace=False))]
            n_test = round(self.test_fraction * len(own))
            order = rng.permutation(len(own))
            test += [own[i] for i in sorted(order[:n_test])]
            train += [own[i] for i in sorted(order[n_test:])]

        def split(part: list) -> Split:
            arrays = imf.load_image_folder_arrays(part, self.image_size, classes=list(names))
            return Split(to_pixels(arrays, self.image_size, self.channels), arrays.y)

        return FederatedData(
            [ClientData(0, root.name, split(train))],
            {root.name: split(test) if test else split(train)},
            num_classes=len(names),
            classes=tuple(names),
        )
