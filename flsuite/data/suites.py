"""The benchmark suite registry `SUITES`: for each suite, its domains' loaders (each returns a domain's train and,
where the dataset has one, official test split as uint8 images), and the `LoadContext` a loader receives.
:class:`flsuite.data.benchmarks.Benchmark` turns a suite into a federation; its docstring tables the suites."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from flsuite.data import folder_names, sources, torchvision_sources
from flsuite.data import image_folder as imf
from flsuite.data.base import DataError
from flsuite.data.image_arrays import ImageArrays, SplitName
from flsuite.data.torchvision_sources import TorchvisionName


@dataclass(frozen=True)
class LoadContext:
    """What a domain loader may need."""

    root: Path
    download: bool
    seed: int
    image_size: int
    usps_mat: Path | None
    syn_samples: tuple[int, int]
    skip_unreadable: bool = False


#: A domain loader returns (train, official test or None).
Loader = Callable[[LoadContext], tuple[ImageArrays, ImageArrays | None]]


def _both(load: Callable[[SplitName], ImageArrays]) -> tuple[ImageArrays, ImageArrays]:
    return load("train"), load("test")


def _folder_suite(
    domains: Sequence[str], classes: Sequence[str] | None, domain_aliases=None, class_aliases=None
) -> dict[str, Loader]:
    def loader(domain: str) -> Loader:
        def load(ctx: LoadContext) -> tuple[ImageArrays, None]:
            names = list(classes) if classes is not None else _discover_classes(ctx.root, domain, domain_aliases)
            entries = imf.scan_image_folder(ctx.root, [domain], names, domain_aliases, class_aliases)[domain]
            if not entries:
                raise DataError(f"domain {domain!r} under {ctx.root} holds no images")
            return imf.load_image_folder_arrays(
                entries, ctx.image_size, classes=names, skip_unreadable=ctx.skip_unreadable
            ), None

        return load

    return {d: loader(d) for d in domains}


def _discover_classes(root: Path, domain: str, aliases) -> list[str]:
    """Class names = the sorted sub-folders of this domain's folder (Office-Home, DomainNet)."""
    if not Path(root).is_dir():
        raise FileNotFoundError(f"image folder root not found: {root}")
    folder = imf.resolve_dir(Path(root), domain, tuple((aliases or {}).get(domain, ())), "domain")
    return sorted(c.name for c in folder.iterdir() if c.is_dir() and not c.name.startswith("."))


def _syn_folder(ctx: LoadContext) -> tuple[ImageArrays, ImageArrays]:
    split_dirs = {s: ctx.root / "syn" / s for s in ("train", "test")}
    out = []
    for split, folder in split_dirs.items():
        if not folder.is_dir():
            raise DataError(
                f"SYN digits {split} split not found at {folder}: put SynDigits there as <digit>/<image> folders, "
                "or use the digits_offline suite (SYN rendered from fonts)"
            )
        entries = imf.scan_image_folder(folder.parent, [split], sources.DIGIT_CLASSES)[split]
        out.append(imf.load_image_folder_arrays(entries, ctx.image_size, classes=sources.DIGIT_CLASSES))
    return out[0], out[1]


def _usps_offline(ctx: LoadContext) -> tuple[ImageArrays, ImageArrays]:
    path = ctx.usps_mat or ctx.root / "usps" / "usps.mat"
    if not Path(path).is_file():
        raise DataError(f"digits_offline needs USPS as a .mat file: {path} not found (set data.init_args.usps_mat)")
    return sources.load_usps_mat(path, "train"), sources.load_usps_mat(path, "test")


def _syn_rendered(ctx: LoadContext) -> tuple[ImageArrays, ImageArrays]:
    from flsuite.data.syn_digits import render_syn_digits

    n_train, n_test = ctx.syn_samples
    # Fixed seeds: the rendered dataset is part of the benchmark, the same for every run seed.
    return render_syn_digits(n_train, seed=1, size=32), render_syn_digits(n_test, seed=2, size=32)


def _tiny_imagenet(ctx: LoadContext) -> tuple[ImageArrays, ImageArrays]:
    base = ctx.root / "tiny-imagenet-200"
    wnids_file = base / "wnids.txt"
    if not wnids_file.is_file():
        raise DataError(f"Tiny-ImageNet not found: expected {wnids_file} (unpack tiny-imagenet-200.zip under root)")
    wnids = wnids_file.read_text().split()
    label = {w: i for i, w in enumerate(wnids)}
    train = [(p, label[w]) for w in wnids for p in sorted((base / "train" / w / "images").glob("*.JPEG"))]
    annotations = base / "val" / "val_annotations.txt"
    val = [
        (base / "val" / "images" / line.split("\t")[0], label[line.split("\t")[1]])
        for line in annotations.read_text().splitlines()
        if line
    ]
    return (
        imf.load_image_folder_arrays(train, ctx.image_size, classes=wnids),
        imf.load_image_folder_arrays(val, ctx.image_size, classes=wnids),
    )


def _torchvision(name: TorchvisionName) -> Loader:
    return lambda ctx: _both(lambda split: torchvision_sources.load_torchvision(name, ctx.root, split, ctx.download))


SUITES: dict[str, dict[str, Loader]] = {
    "digits": {
        "mnist": _torchvision("mnist"),
        "usps": lambda ctx: _both(lambda s: torchvision_sources.load_usps_torchvision(ctx.root, s, ctx.download)),
        "svhn": _torchvision("svhn"),
        "syn": _syn_folder,
    },
    "digits_offline": {
        "mnist": lambda ctx: _both(sources.load_mnist_pureml),
        "usps": _usps_offline,
        "uci": lambda ctx: (sources.load_uci_digits(), None),
        "syn": _syn_rendered,
    },
    "office_caltech10": _folder_suite(
        folder_names.OFFICE_CALTECH10_DOMAINS,
        folder_names.OFFICE_CALTECH10_CLASSES,
        folder_names.OFFICE_CALTECH10_DOMAIN_ALIASES,
        folder_names.OFFICE_CALTECH10_CLASS_ALIASES,
    ),
    "pacs": _folder_suite(
        folder_names.PACS_DOMAINS,
        folder_names.PACS_CLASSES,
        folder_names.PACS_DOMAIN_ALIASES,
        folder_names.PACS_CLASS_ALIASES,
    ),
    "office_home": _folder_suite(
        ("art", "clipart", "product", "real_world"), None, {"real_world": ("Real World", "RealWorld", "real")}
    ),
    "domainnet": _folder_suite(("clipart", "infograph", "painting", "quickdraw", "real", "sketch"), None),
    "mnist": {"mnist": _torchvision("mnist")},
    "fashion_mnist": {"fashion_mnist": _torchvision("fashion_mnist")},
    "fashion_mnist_debian": {"fashion_mnist": lambda ctx: _both(sources.load_fashion_mnist_debian)},
    "cifar10": {"cifar10": _torchvision("cifar10")},
    "cifar100": {"cifar100": _torchvision("cifar100")},
    "tiny_imagenet": {"tiny_imagenet": _tiny_imagenet},
}
