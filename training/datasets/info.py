"""What every dataset source returns beside its examples."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Info:
    """What the model needs to know about a dataset."""

    name: str
    num_classes: int
    class_names: tuple
    num_channels: int
    splits: dict  # split name -> number of examples
