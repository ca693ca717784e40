"""asyncssh, imported here for the whole package, without the warnings its import prints.

cryptography 48+ deprecates DSA by warning on every access to its `dsa` module's names, and asyncssh names
them in annotations it evaluates while it imports: five `CryptographyDeprecationWarning: DSA is deprecated`
lines on stderr before any fleetgen command's own output (issue 30). The filter is installed before the
import and holds for that category raised from asyncssh's own modules only: a DSA use anywhere else still
warns. `ssh.py` and `sshconnect.py` take asyncssh from here (`from fleetgen.remote.sshlib import asyncssh`).
cryptography is asyncssh's own dependency.
"""

from __future__ import annotations

import warnings

from cryptography.utils import CryptographyDeprecationWarning

warnings.filterwarnings("ignore", category=CryptographyDeprecationWarning, module=r"asyncssh(\.|$)")

import asyncssh  # noqa: E402  (after the filter: the warnings are raised while asyncssh imports)

__all__ = ["asyncssh"]
