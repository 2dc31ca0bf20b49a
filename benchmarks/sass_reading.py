"""Reading ptxas -v's report and nvdisasm's SASS for benchmarks/kernel_budget.py: the entry
function's resources, the loops (backward branches), the measured loop of a case and its
counts per element (instructions, 64-bit integer and integer-pipe ones, load and store
widths).  Pure text processing: no GPU, no compiler.
"""

from __future__ import annotations

import re

#: SASS opcodes the integer pipe (ALU) issues on sm_90
ALU = frozenset({"LOP3", "LOP", "IADD3", "IADD", "VIADD", "SHF", "SHL", "SHR", "ISETP", "SEL",
                 "PRMT", "LEA", "MOV", "FSETP", "FSEL", "FMNMX", "IMNMX", "VIMNMX", "PLOP3",
                 "P2R", "R2P", "BFI", "BFE", "FLO", "POPC", "IABS", "FCHK", "SGXT", "BMSK",
                 "F2FP", "I2IP"})


def is_alu(op: str) -> bool:
    """Whether a SASS opcode issues on the integer pipe (:data:`ALU`)."""
    return op.split(".")[0] in ALU


def resources(report: str) -> dict:
    """Registers, spill bytes (stores + loads), stack frame and shared memory of the entry
    function, from ptxas -v (the subroutines it calls are reported after it)."""
    entry = report.split("Compiling entry function", 1)[-1]
    regs = re.search(r"Used (\d+) registers", entry)
    stack = re.search(r"(\d+) bytes stack frame", entry)
    smem = re.search(r"(\d+) bytes smem", entry)
    return {"registers": int(regs.group(1)),
            "spill_bytes": sum(int(v) for v in re.findall(r"(\d+) bytes spill", entry)),
            "stack_bytes": int(stack.group(1)) if stack else 0,
            "shared_bytes": int(smem.group(1)) if smem else 0}


_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T\d]+\s+)?([A-Z][\w.]*)(.*?);")
_LABEL = re.compile(r"^([.$][\w$.]+):")
_TARGET = re.compile(r"`\(([.$][\w$.]+)\)")
#: Philox-4x32's multipliers 0xD2511F53 and 0xCD9E8D57 as SASS writes them (signed)
_PHILOX = re.compile(r"-0x2daee0ad|-0x326172a9|0xd2511f53|0xcd9e8d57", re.IGNORECASE)


def parse_sass(sass: str) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """([(opcode, operands)] in address order, {label: index of the next instruction})."""
    code, labels = [], {}
    for line in sass.splitlines():
        label = _LABEL.match(line.strip())
        if label:
            labels[label.group(1)] = len(code)
            continue
        found = _INSTRUCTION.match(line)
        if found:
            code.append((found.group(2), found.group(3)))
    return code, labels


def loops(code, labels) -> list[tuple[int, int]]:
    """(first, last) instruction index of each loop: a branch back to a label at or before
    it closes a loop starting at that label (several back edges to one head: the last)."""
    heads: dict[int, int] = {}
    for i, (op, operands) in enumerate(code):
        target = _TARGET.search(operands)
        if op.startswith("BRA") and target and labels.get(target.group(1), i + 1) <= i:
            head = labels[target.group(1)]
            heads[head] = max(heads.get(head, i), i)
    return sorted(heads.items())


def width(op: str) -> int:
    """Bits moved by a load or store opcode: LDG.E.128 -> 128, LDG.E.U16 -> 16, LDG.E -> 32."""
    parts = set(op.split(".")[1:])
    for bits, names in ((128, {"128"}), (64, {"64"}), (16, {"U16", "S16"}), (8, {"U8", "S8"})):
        if parts & names:
            return bits
    return 32


def is_int64(op: str) -> bool:
    """A heuristic for an integer instruction that is there because a value is 64 bits: a
    wide multiply (IMAD.WIDE), a 64-bit shift or conversion (SHF.R.U64, I2F.U64), or the high
    half of a 64-bit add or compare (IADD3.X, LEA.HI.X, ISETP ... .EX); memory ops excluded."""
    parts = set(op.split(".")[1:])
    return (not op.startswith(("LD", "ST", "ULD", "RED", "ATOM"))
            and bool(parts & {"WIDE", "64", "U64", "S64", "X", "EX"}))


def _inside(loop, i) -> bool:
    return loop[0] <= i <= loop[1]


def measure(sass: str, case) -> dict:
    """The SASS facts of one case (a kernel_budget.Case): its measured loop and the kernel's
    local memory."""
    code, labels = parse_sass(sass)
    found = loops(code, labels)
    local = [op for op, _ in code if op.startswith(("LDL", "STL"))]
    row = {"instructions": len(code), "local_ops": len(local),
           "local_op_bytes": sum(width(op) for op in local) // 8}
    # global loads inside a loop: one outside every loop is a prologue's or a tail's
    loads = [i for i, (op, _) in enumerate(code)
             if op.startswith("LDG") and any(_inside(lp, i) for lp in found)]
    philox = [i for i, (_, operands) in enumerate(code) if _PHILOX.search(operands)]

    def draws(i):     # a loop holding load i also holds a Philox multiply
        return any(_inside(lp, i) and any(_inside(lp, j) for j in philox) for lp in found)

    if case.loads == "wide":
        loads = [i for i in loads if width(code[i][0]) >= 64]
    elif case.loads == "stores":
        loads = [i for i, (op, _) in enumerate(code) if op.startswith("STG")
                 and width(op) >= 64 and any(_inside(lp, i) for lp in found)]
    elif case.loads == "most":            # the loop with the most (an unrolled main loop)
        top = max(found, key=lambda lp: sum(_inside(lp, i) for i in loads))
        loads = [i for i in loads if _inside(top, i)]
    elif case.loads != "all":
        loads = [i for i in loads if draws(i) == (case.loads == "philox")]
    holding = [lp for lp in found if loads and all(_inside(lp, i) for i in loads)]
    if not holding:
        raise ValueError(f"{case.name}: no loop holds its global loads ({case.loads}); "
                         f"loops {found}, loads {loads}")
    inner = min(holding, key=lambda lp: lp[1] - lp[0])
    body = code[inner[0]:inner[1] + 1]
    if case.cold_loops:
        nested = [lp for lp in found if lp != inner and _inside(inner, lp[0])]
        body = [ins for i, ins in enumerate(body, inner[0])
                if not any(lp[0] <= i <= lp[1] for lp in nested)]
    # elements 0: one an element load of the loop (however often the compiler unrolled it)
    elements = case.elements or sum(op.startswith("LDG") for op, _ in body)
    count = len(body) / elements
    wide = sum(map(is_int64, (op for op, _ in body))) / elements
    alu = sum(map(is_alu, (op for op, _ in body))) / elements
    span = body
    if case.outer:
        around = [lp for lp in found if lp != inner and lp[0] <= inner[0] and inner[1] <= lp[1]]
        if not around:
            raise ValueError(f"{case.name}: outer={case.outer} but no loop encloses {inner}")
        outer = min(around, key=lambda lp: lp[1] - lp[0])
        span = code[outer[0]:outer[1] + 1]
        own = span[:inner[0] - outer[0]] + span[inner[1] + 1 - outer[0]:]
        count += len(own) / case.outer
        wide += sum(map(is_int64, (op for op, _ in own))) / case.outer
        alu += sum(map(is_alu, (op for op, _ in own))) / case.outer
    return dict(row, loop_instructions=len(body), elements_per_iteration=elements,
                loop_instructions_per_element=round(count, 1),
                loop_int64_per_element=round(wide, 1),
                loop_alu_per_element=round(alu, 1),
                loop_calls=sum(op.startswith("CALL") for op, _ in span),
                load_bits=max((width(op) for op, _ in span if op.startswith("LDG")), default=0),
                store_bits=max((width(op) for op, _ in span if op.startswith("STG")),
                               default=0))
