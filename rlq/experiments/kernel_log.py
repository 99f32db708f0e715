"""The notebook kernel's own stderr goes to ``kernel.log`` in the run folder, not to the terminal of ``rlq run``.

The kernel process writes its log there (ipykernel's warnings, and the traceback it prints when it is shut down
in the middle of a reply, as on SIGTERM); a cell's own output still reaches the executed notebook.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager

from rlq.experiments.run_folders import RUN_DIR_ENV

KERNEL_LOG = "kernel.log"


class LoggedKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel writes its stderr into ``kernel.log`` of the run folder (``RLQ_RUN_DIR``)."""

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
        folder = os.environ.get(RUN_DIR_ENV)
        if folder is None or "stderr" in kw:
            return await super()._async_launch_kernel(kernel_cmd, **kw)
        with open(Path(folder) / KERNEL_LOG, "ab") as log:  # the kernel keeps its own copy of the file
            return await super()._async_launch_kernel(kernel_cmd, **{**kw, "stderr": log})
