"""An exported C policy on a Cortex-M4: cross-compiled, run in QEMU, its actions, sizes and instruction counts.

The machine is QEMU's ``mps2-an386`` board (ARM's MPS2 with the AN386 image: a Cortex-M4 with its
single-precision FPU, code memory at ``0x00000000``, RAM at ``0x20000000``, 4 MiB each). It runs on any host
where ``arm-none-eabi-gcc`` (with newlib) and ``qemu-system-arm`` are installed: ``make export-tools``
installs them on Debian.

The C it takes is a directory holding ``NAME.h`` and ``NAME.c`` (C99, no malloc; what
:func:`rlq.deploy.write_c` writes, ``NAME`` being its ``name``, ``policy`` by default), which expose
``void NAME_act(const float *obs, float *action)`` and define ``NAME_OBS_DIM`` and ``NAME_ACTION_DIM``.

- :func:`build_cortex_m` writes a harness (the observations as a ``const float`` array, one call of
  ``NAME_act`` per observation, each action printed through semihosting as the hex of its floats' 32-bit
  patterns, so that the host reads back exactly the floats the M4 computed), a vector table and a linker
  script, and links them with the policy into an ELF (``-mfloat-abi=hard -mfpu=fpv4-sp-d16 -O2 -Werror``).
- :func:`run_qemu` runs the ELF and returns the actions and, for each, the number of instructions the M4
  executed from the first instruction of ``NAME_act`` to its return into the harness, the libm functions it
  calls included. QEMU translates one instruction per block (``-singlestep``, ``one-insn-per-tb`` in newer
  QEMU) and logs each block as it executes (``-d exec,nochain``); counting the log's lines between the
  entry and the return address is exact and the same on every run. It is a count of instructions, not of
  cycles: QEMU models no pipeline, wait states or FPU latencies, and on a real M4 a load takes two cycles
  and a float multiply-accumulate three.
- :func:`section_sizes` and :func:`policy_object_sizes`: flash and RAM of the whole ELF (harness, startup
  and newlib included) and of the policy's own object (its code and weights, without the libm functions
  it calls).
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import threading
from collections.abc import Iterable
from pathlib import Path

import numpy as np

INSTALL_COMMAND = "make export-tools"
"""The command that installs the cross compiler, newlib and QEMU (Debian packages, ``tools/export_tools.sh``)."""
CC = "arm-none-eabi-gcc"
SIZE = "arm-none-eabi-size"
OBJDUMP = "arm-none-eabi-objdump"
QEMU = "qemu-system-arm"
MACHINE = "mps2-an386"
CFLAGS = (
    "-mcpu=cortex-m4",
    "-mthumb",
    "-mfloat-abi=hard",
    "-mfpu=fpv4-sp-d16",
    "-O2",
    "-std=c99",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-ffunction-sections",
    "-fdata-sections",
)
"""The flags every C file of the ELF is compiled with, the policy's own object included."""
LDFLAGS = ("--specs=nano.specs", "--specs=rdimon.specs", "-nostartfiles", "-Wl,--gc-sections")
"""newlib-nano with rdimon, newlib's semihosting system calls; the startup is the harness's own."""
_FLASH_SECTIONS = (".text", ".rodata", ".data")
_RAM_SECTIONS = (".data", ".bss")
_CF_COUNT_MASK = 0x1FF  # QEMU's cflags bits holding a translation block's instruction limit

_LINKER_SCRIPT = """\
/* QEMU mps2-an386: code memory (ZBT SSRAM1) at 0x0, RAM (ZBT SSRAM2/3) at 0x20000000 */
MEMORY
{
    FLASH (rx) : ORIGIN = 0x00000000, LENGTH = 4M
    RAM (rwx) : ORIGIN = 0x20000000, LENGTH = 4M
}
ENTRY(rlq_reset)
SECTIONS
{
    .text : { KEEP(*(.vectors)) *(.text*) *(.rodata*) . = ALIGN(4); } > FLASH
    .ARM.exidx : { *(.ARM.exidx*) } > FLASH
    .data : { __data_start__ = .; *(.data*) . = ALIGN(4); __data_end__ = .; } > RAM AT > FLASH
    __data_load__ = LOADADDR(.data);
    .bss (NOLOAD) : { __bss_start__ = .; *(.bss*) *(COMMON) . = ALIGN(4); __bss_end__ = .; } > RAM
    end = .;
    __end__ = .;
    __stack_top__ = ORIGIN(RAM) + LENGTH(RAM);
}
"""

_STARTUP = """\
#include <stdint.h>
#include <unistd.h>

extern uint32_t __data_load__, __data_start__, __data_end__, __bss_start__, __bss_end__, __stack_top__;
extern int main(void);
extern void initialise_monitor_handles(void);
void rlq_reset(void);

/* a fault ends QEMU through semihosting SYS_EXIT (ADP_Stopped_RunTimeErrorUnknown) without using the stack */
static void rlq_fault(void)
{
    __asm__ volatile("movs r0, #0x18\\n\\tmovw r1, #0x0024\\n\\tmovt r1, #0x2\\n\\tbkpt 0xab" ::: "r0", "r1", "memory");
    for (;;) {
    }
}

__attribute__((section(".vectors"), used)) static const void *const rlq_vectors[16] = {
    &__stack_top__,          (const void *)rlq_reset, (const void *)rlq_fault, (const void *)rlq_fault,
    (const void *)rlq_fault, (const void *)rlq_fault, (const void *)rlq_fault,
};

void rlq_reset(void)
{
    uint32_t *src = &__data_load__;
    uint32_t *dst = &__data_start__;
    while (dst < &__data_end__) {
        *dst++ = *src++;
    }
    for (dst = &__bss_start__; dst < &__bss_end__; dst++) {
        *dst = 0;
    }
    /* CPACR: full access to CP10 and CP11 (the FPU) before the first float instruction */
    *(volatile uint32_t *)0xE000ED88 |= 0xFu << 20;
    __asm__ volatile("dsb\\n\\tisb" ::: "memory");
    initialise_monitor_handles();
    _exit(main());
}
"""

_HARNESS = """\
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include "{name}.h"

#define RLQ_STEPS {steps}

static const float rlq_observations[RLQ_STEPS][{prefix}_OBS_DIM] = {{
{observations}
}};

int main(void)
{{
    static const char digits[] = "0123456789abcdef";
    float action[{prefix}_ACTION_DIM];
    char line[9 * {prefix}_ACTION_DIM];
    for (int step = 0; step < RLQ_STEPS; step++) {{
        {name}_act(rlq_observations[step], action);
        for (int i = 0; i < {prefix}_ACTION_DIM; i++) {{
            uint32_t bits;
            memcpy(&bits, &action[i], sizeof bits);
            for (int k = 7; k >= 0; k--) {{
                line[9 * i + k] = digits[bits & 15u];
                bits >>= 4;
            }}
            line[9 * i + 8] = ' ';
        }}
        line[9 * {prefix}_ACTION_DIM - 1] = '\\n';
        if (write(1, line, sizeof line) != (int)sizeof line) {{
            return 2;
        }}
    }}
    return 0;
}}
"""


def tools_available() -> bool:
    """Return whether the cross compiler, its ``size`` and ``objdump``, and ``qemu-system-arm`` are on PATH."""
    return all(shutil.which(tool) for tool in (CC, SIZE, OBJDUMP, QEMU))


def _require_tools() -> None:
    if not tools_available():
        missing = [tool for tool in (CC, SIZE, OBJDUMP, QEMU) if not shutil.which(tool)]
        raise RuntimeError(f"{', '.join(missing)} not found: install them with `{INSTALL_COMMAND}`")


def _run_tool(args: list[str], what: str) -> str:
    """Run a tool of the toolchain; a failure raises with its first error line (the compiler's diagnostic)."""
    result = subprocess.run(args, capture_output=True, text=True)
    if result.returncode != 0:
        lines = [line for line in (result.stderr + result.stdout).splitlines() if line.strip()]
        first = next((line for line in lines if re.search(r"error|undefined reference", line)), None)
        first = first or (lines[-1] if lines else f"exit status {result.returncode}")
        raise RuntimeError(f"{what} failed: {first}")
    return result.stdout


def _read_dims(c_dir: Path, name: str) -> tuple[int, int]:
    """The observation and action sizes ``NAME.h`` defines for ``name``."""
    header = (c_dir / f"{name}.h").read_text()
    dims = []
    for what in ("OBS_DIM", "ACTION_DIM"):
        macro = f"{name.upper()}_{what}"
        found = re.search(rf"#\s*define\s+{macro}\s+\(?(\d+)\)?", header)
        if found is None:
            raise ValueError(f"{c_dir / (name + '.h')} defines no {macro}")
        dims.append(int(found.group(1)))
    return dims[0], dims[1]


def _float_literal(value: np.float32) -> str:
    """A C hex-float literal holding exactly this float32."""
    return float(value).hex() + "f"


def _harness_source(name: str, observations: np.ndarray) -> str:
    rows = ",\n".join("    {" + ", ".join(_float_literal(x) for x in row) + "}" for row in observations)
    return _HARNESS.format(steps=len(observations), prefix=name.upper(), name=name, observations=rows)


def build_cortex_m(c_dir: Path, name: str, observations: np.ndarray, out: Path) -> Path:
    """Cross-compile the policy in ``c_dir`` with a harness acting on ``observations`` into a Cortex-M4 ELF.

    Args:
        c_dir: the directory holding ``NAME.h`` and ``NAME.c``.
        name: the C prefix of the policy's symbols (``policy`` for ``policy_act`` and ``POLICY_OBS_DIM``).
        observations: a finite ``(steps, obs_dim)`` array; each row is rounded to float32 and stored exactly
            (as hex-float literals) in the harness's flash.
        out: the directory that receives ``main.c``, ``startup.c``, ``cortex_m4.ld`` and ``NAME.elf``.

    Returns:
        The ELF's path, for :func:`run_qemu` and :func:`section_sizes`.

    Raises:
        RuntimeError: the tools are absent (naming ``make export-tools``), or compiling or linking failed
            (with the compiler's first error line).
        ValueError: ``name`` is not a C identifier, ``NAME.h`` lacks the sizes, or the observations have
            another width, no rows or a non-finite value.
    """
    _require_tools()
    c_dir, out = Path(c_dir), Path(out)
    if not re.fullmatch(r"[A-Za-z_]\w*", name):
        raise ValueError(f"name {name!r} is not a C identifier")
    obs_dim, _ = _read_dims(c_dir, name)
    obs = np.asarray(observations, dtype=np.float32)
    if obs.ndim != 2 or obs.shape[0] == 0 or obs.shape[1] != obs_dim:
        raise ValueError(f"observations must have shape (steps >= 1, {obs_dim}), not {obs.shape}")
    if not np.isfinite(obs).all():
        raise ValueError("observations must be finite")
    out.mkdir(parents=True, exist_ok=True)
    (out / "main.c").write_text(_harness_source(name, obs))
    (out / "startup.c").write_text(_STARTUP)
    (out / "cortex_m4.ld").write_text(_LINKER_SCRIPT)
    elf = out / f"{name}.elf"
    sources = [str(out / "main.c"), str(out / "startup.c"), str(c_dir / f"{name}.c")]
    args = [
        CC,
        *CFLAGS,
        *LDFLAGS,
        f"-I{c_dir}",
        "-T",
        str(out / "cortex_m4.ld"),
        *sources,
        "-lm",
        "-o",
        str(elf),
    ]
    _run_tool(args, f"compiling {c_dir / (name + '.c')} for the Cortex-M4")
    return elf


def section_sizes(elf: Path) -> dict[str, int]:
    """Bytes of an ELF as ``arm-none-eabi-size -B`` counts them.

    Returns ``text``, ``data`` and ``bss`` (``text`` includes the vector table and read-only data), ``flash``
    (``text + data``: what is programmed into flash, the initial values of ``.data`` included) and ``ram``
    (``data + bss``: static RAM; the stack, set at the top of RAM, is not counted).
    """
    _require_tools()
    output = _run_tool([SIZE, "-B", str(elf)], f"reading the sizes of {elf}")
    text, data, bss = (int(field) for field in output.splitlines()[1].split()[:3])
    return {"text": text, "data": data, "bss": bss, "flash": text + data, "ram": data + bss}


def policy_object_sizes(c_dir: Path, out: Path | None = None, name: str = "policy") -> dict[str, int]:
    """Flash and RAM bytes of the policy alone: ``NAME.c`` compiled to an object with the ELF's flags.

    ``flash`` sums the object's ``.text*``, ``.rodata*`` and ``.data*`` sections (code, weights, initial
    values), ``code`` its ``.text*`` (the instructions alone), ``ram`` its ``.data*`` and ``.bss*``. The libm
    functions the policy calls (``tanhf``) are not in the object; they count in :func:`section_sizes` of the
    ELF. ``out`` receives ``NAME.o`` (by default ``c_dir``).
    """
    _require_tools()
    c_dir = Path(c_dir)
    obj = Path(out or c_dir) / f"{name}.o"
    obj.parent.mkdir(parents=True, exist_ok=True)
    _run_tool(
        [CC, *CFLAGS, f"-I{c_dir}", "-c", str(c_dir / f"{name}.c"), "-o", str(obj)], f"compiling {c_dir}"
    )
    sizes = {"flash": 0, "code": 0, "ram": 0}
    for line in _run_tool([SIZE, "-A", str(obj)], f"reading the sizes of {obj}").splitlines():
        fields = line.split()
        if len(fields) < 2 or not fields[1].isdigit():
            continue
        section, size = fields[0], int(fields[1])
        sizes["flash"] += size if section.startswith(_FLASH_SECTIONS) else 0
        sizes["code"] += size if section.startswith(".text") else 0
        sizes["ram"] += size if section.startswith(_RAM_SECTIONS) else 0
    return sizes


def _policy_calls(elf: Path) -> tuple[int, frozenset[int]]:
    """The entry address of the policy's ``*_act`` and the return addresses of its calls in ``main``.

    The harness calls it in one loop; the compiler may still unroll that loop, so every call site counts.
    """
    listing = _run_tool([OBJDUMP, "-d", "--disassemble=main", str(elf)], f"disassembling {elf}")
    addresses = [(re.match(r"^\s*([0-9a-f]+):", line), line) for line in listing.splitlines()]
    instructions = [(int(found.group(1), 16), line) for found, line in addresses if found]
    calls = []
    for (_, line), (following, _) in zip(instructions, instructions[1:], strict=False):
        found = re.search(r"\sbl\s+([0-9a-f]+) <(\w+_act)>", line)
        if found:
            calls.append((int(found.group(1), 16), following))
    entries = {entry for entry, _ in calls}
    if len(entries) != 1:
        raise RuntimeError(
            f"{elf}: expected calls to one policy *_act in main, found {len(entries)} functions"
        )
    return entries.pop(), frozenset(following for _, following in calls)


@functools.cache
def _one_instruction_per_block() -> tuple[str, ...]:
    """QEMU's option for one instruction per translation block: ``-singlestep`` until 8.1, then an accel option."""
    help_text = subprocess.run([QEMU, "-help"], capture_output=True, text=True).stdout
    return ("-accel", "tcg,one-insn-per-tb=on") if "one-insn-per-tb" in help_text else ("-singlestep",)


def qemu_command(elf: Path) -> list[str]:
    """The ``qemu-system-arm`` command :func:`run_qemu` runs: semihosting on, each executed instruction logged."""
    return [
        QEMU,
        "-M",
        MACHINE,
        "-nographic",
        "-monitor",
        "none",
        "-semihosting-config",
        "enable=on,target=native",
        *_one_instruction_per_block(),
        "-d",
        "exec,nochain",
        "-kernel",
        str(elf),
    ]


def _count_instructions(
    log: Iterable[bytes], entry: int, returns: frozenset[int]
) -> tuple[list[int], list[str]]:
    """Instructions logged from each ``entry`` up to the next of ``returns``; other lines kept for errors."""
    counts: list[int] = []
    others: list[str] = []
    inside = None
    for line in log:
        if not line.startswith(b"Trace "):
            if len(others) < 50:
                others.append(line.decode(errors="replace").rstrip())
            continue
        fields = line[line.index(b"[") + 1 : line.index(b"]")].split(b"/")
        if int(fields[3], 16) & _CF_COUNT_MASK != 1:
            raise RuntimeError(
                f"QEMU translated more than one instruction per block: {line.decode().strip()}"
            )
        pc = int(fields[1], 16)
        if inside is None:
            inside = 0 if pc == entry else None
        elif pc in returns:
            counts.append(inside)
            inside = None
            continue
        if inside is not None:
            inside += 1
    return counts, others


def run_qemu(elf: Path, timeout: float = 60) -> tuple[np.ndarray, np.ndarray]:
    """Run an ELF from :func:`build_cortex_m` on QEMU's ``mps2-an386``; return its actions and instruction counts.

    Returns:
        ``(actions, instructions)``: a float32 ``(steps, action_dim)`` array, bit for bit the floats the M4
        computed, and an int64 ``(steps,)`` array, the instructions executed by each call of ``NAME_act``
        from its first instruction through its return, the functions it calls (libm's ``tanhf``) included.
        The count comes from QEMU's log of executed translation blocks of one instruction each; it is
        exact and the same on every run. It counts instructions, not cycles.

    What the program prints is kept in ``NAME.stdout`` beside the ELF.

    Raises:
        RuntimeError: the tools are absent, QEMU ran past ``timeout`` seconds, the program faulted or exited
            with another status, or it printed another number of actions than it made calls.
    """
    _require_tools()
    elf = Path(elf)
    entry, returns = _policy_calls(elf)
    stdout_path = elf.with_suffix(".stdout")
    with open(stdout_path, "wb") as stdout:
        process = subprocess.Popen(
            qemu_command(elf), stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE
        )
        timer = threading.Timer(timeout, process.kill)
        timer.start()
        try:
            counts, others = _count_instructions(process.stderr, entry, returns)
            status = process.wait()
        finally:
            timer.cancel()
            process.kill()
            process.stderr.close()
    if status < 0:
        raise RuntimeError(f"{QEMU} ran past {timeout} s on {elf} and was stopped")
    if status != 0:
        detail = "; ".join(others[-5:]) or "no message"
        raise RuntimeError(
            f"{QEMU} exited with status {status} on {elf} (the program faulted or failed): {detail}"
        )
    lines = stdout_path.read_text().split("\n")
    rows = [line.split() for line in lines if re.fullmatch(r"[0-9a-f]{8}( [0-9a-f]{8})*", line)]
    if not rows or len(rows) != len(counts):
        raise RuntimeError(f"{elf} printed {len(rows)} actions for {len(counts)} calls of the policy")
    bits = np.array([[int(word, 16) for word in row] for row in rows], dtype=np.uint32)
    return bits.view(np.float32), np.array(counts, dtype=np.int64)
