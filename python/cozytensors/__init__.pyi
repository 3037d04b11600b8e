# The names `cozytensors/__init__.py` loads on first use, for type checkers.
from safetensors import SafetensorError as SafetensorError

from ._api import Array as Array
from ._api import Checkpoint as Checkpoint
from ._api import ClassRef as ClassRef
from ._api import Component as Component
from ._api import DecodeError as DecodeError
from ._api import DiskFullError as DiskFullError
from ._api import Encoded as Encoded
from ._api import Encoding as Encoding
from ._api import Error as Error
from ._api import FormatError as FormatError
from ._api import IntegrityError as IntegrityError
from ._api import InvalidError as InvalidError
from ._api import NetworkError as NetworkError
from ._api import NotFoundError as NotFoundError
from ._api import Pipeline as Pipeline
from ._api import StorageError as StorageError
from ._api import TensorMetadata as TensorMetadata
from ._api import Tensors as Tensors
from ._api import UnknownSchemeError as UnknownSchemeError
from ._api import UnsupportedError as UnsupportedError
from ._api import open as open
from ._loader import load_file as load_file
from ._loader import safe_open as safe_open
