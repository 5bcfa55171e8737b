"""What a spec asks beyond plain additions: the one check of what an engine, a route or an export can run.

    >>> check_additive(spec, VLLM, where="valueprobe.spec: ")        # the vLLM engine's payload
    >>> beyond(spec, GRAPH)                                          # [] when nnsight can run it
    ['op clamp']

The hooks route (and so the hf engine) runs every spec: its hooks see h at every forward. The
others take a spec as data, the vectors α·unit·v̂ of `valueprobe.hooks.addition.addition` added on
the residual stream: nnsight's generate graph (built before the run starts), the vLLM plugin (one
vector per steered block in the workers) and an exported control vector (one vector per block at
every position, which the other tools add). Each is an `Additive`, saying what else it takes (the
prompt or generated phase, several axes at once); `beyond` lists what a spec asks past that, and
`refusal` words it as the one line that names them, who cannot run them and the way out.
"""

from __future__ import annotations

from dataclasses import dataclass

from valueprobe.errors import ValueprobeError
from valueprobe.steering.hook.spec import SteeringSpec
from valueprobe.vocab import HookSite, Op

__all__ = ["CONTROL_VECTOR", "GRAPH", "VLLM", "Additive", "beyond", "check_additive", "refusal"]

RESIDUAL = (HookSite.resid_pre, HookSite.resid_post)


@dataclass(frozen=True)
class Additive:
    """Something that runs a spec as additions α·unit·v̂ on the residual stream.

    Attributes:
        who: its name in a refusal (``the vllm engine``).
        fix: what to do instead (``use --engine hf``).
        phases: it can add on the prompt or the generated tokens only (False: every position).
        axes: it adds several axes at once (False: one axis per spec).
    """

    who: str
    fix: str
    phases: bool = True
    axes: bool = True

    def scope(self) -> str:
        where = "" if self.phases else " at every position"
        return f"adds α·unit·v̂ on the residual stream{where}{'' if self.axes else ', one axis at a time'}"


GRAPH = Additive("nnsight's generate graph", "use --route hooks")
VLLM = Additive("the vllm engine", "use --engine hf", axes=False)
CONTROL_VECTOR = Additive("a control vector", "steer with valueprobe (vp.steer) instead", phases=False)


def beyond(spec: SteeringSpec, runner: Additive) -> list[str]:
    """What ``spec`` asks that ``runner`` cannot add, one phrase each (empty: it runs as additions)."""
    out = [f"op {spec.op.op.value}"] if spec.op.op != Op.add else []
    if spec.site is not None and spec.site not in RESIDUAL:
        out.append(f"site {spec.site.value}")
    if spec.window is not None:
        out.append("a window of generated tokens")
    if spec.condition is not None:
        out.append("a condition")
    if not runner.phases and spec.positions != "all":
        out.append(f"positions {spec.positions}")
    if not runner.axes and len(spec.axes()) != 1:
        out.append(f"{len(spec.axes())} axes")
    return out


def refusal(spec: SteeringSpec, runner: Additive, *, where: str = "") -> str:
    """The one line refusing ``spec`` on ``runner``, or ``""`` when it can run it."""
    asked = beyond(spec, runner)
    if not asked:
        return ""
    return f"{where}{' with '.join(asked)}: {runner.who} only {runner.scope()}: {runner.fix}"


def check_additive(spec: SteeringSpec, runner: Additive, *, where: str = "") -> None:
    """Raise the `refusal` of ``spec`` on ``runner`` as a `ValueprobeError`, if there is one."""
    line = refusal(spec, runner, where=where)
    if line:
        raise ValueprobeError(line)
