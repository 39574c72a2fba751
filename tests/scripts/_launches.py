"""What the test scripts in this folder share: a record of the kernels CPU-placed JAX launches."""

from slax._config import current_routes
from slax._launch import launcher_for


def record_launches() -> list[tuple[str, int]]:
    """A list that from now on receives ``(entry point, threads)`` for every kernel launched by the
    launcher CPU-placed JAX takes here (host copies or host pointers), as it runs."""
    launches: list[tuple[str, int]] = []
    launcher_type = type(launcher_for("cpu", current_routes()))
    original = launcher_type.callback

    def recording_callback(self, spec, scalars, count, aliases):
        run = original(self, spec, scalars, count, aliases)

        def recorded(ctx, outs, *ins):
            launches.append((spec.entry, count))
            return run(ctx, outs, *ins)

        return recorded

    launcher_type.callback = recording_callback
    return launches
