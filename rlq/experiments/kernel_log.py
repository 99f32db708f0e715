"""The kernel manager of rlq's runs: the kernel's stderr goes to ``kernel.log``, its sockets are private files.

The kernel process writes its log into the run folder (ipykernel's warnings, and the traceback it prints when it
is shut down in the middle of a reply, as on SIGTERM); a cell's own output still reaches the executed notebook.

Its ZeroMQ sockets are Unix sockets in a folder of its own, not TCP ports. Jupyter picks a TCP kernel's ports by
binding to free ones and closing them before the kernel binds them again, so two kernels started at the same
moment by different processes (a sweep's or a campaign's workers) can take the same port, and one of them dies
before its first cell with "Address already in use". Socket files named after a private folder cannot collide.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager

from rlq.experiments.run_folders import RUN_DIR_ENV

KERNEL_LOG = "kernel.log"
MAX_SOCKET_PATH = 100
"""Longest Unix socket path used (Linux allows 107 bytes); a longer temporary folder keeps TCP."""


class RunKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel writes its stderr into ``kernel.log`` of the run folder (``RLQ_RUN_DIR``)
    and, on POSIX without an explicit transport, talks over Unix sockets in a temporary folder of its own."""

    def __init__(self, **kwargs: Any) -> None:
        self._socket_folder: str | None = None
        if os.name == "posix" and "transport" not in kwargs and "ip" not in kwargs:
            folder = tempfile.mkdtemp(prefix="rlq-kernel-")
            if len(folder) + len("/k-65535") <= MAX_SOCKET_PATH:
                self._socket_folder = folder
                kwargs = {**kwargs, "transport": "ipc", "ip": f"{folder}/k"}
            else:
                os.rmdir(folder)
        super().__init__(**kwargs)

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
        folder = os.environ.get(RUN_DIR_ENV)
        if folder is None or "stderr" in kw:
            return await super()._async_launch_kernel(kernel_cmd, **kw)
        with open(Path(folder) / KERNEL_LOG, "ab") as log:  # the kernel keeps its own copy of the file
            return await super()._async_launch_kernel(kernel_cmd, **{**kw, "stderr": log})

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if not restart and self._socket_folder is not None:
            shutil.rmtree(self._socket_folder, ignore_errors=True)
            self._socket_folder = None
