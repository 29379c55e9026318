"""One stand-in triggerer for ``trigger_notice.py``: runs one ``DeltaLeaseTrigger`` per waiting request on one
event loop, as a triggerer's runner does, and prints a JSON line when all have started and one per event.

Kept apart from the benchmark so that the package it imports is the one ``PYTHONPATH`` names: this checkout's,
or the baseline's tree the benchmark unpacked from git.

Usage: ``python trigger_notice_worker.py WAITS_JSON`` with ``AIRFLOW_CONN_DELTA_OCC_LEASES`` set; ``WAITS_JSON``
holds ``[[request_id, request_json, poll_interval], ...]``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from airflow_delta_occ.triggers.lease import DeltaLeaseTrigger


def main() -> None:
    waits = json.loads(open(sys.argv[1]).read())

    def say(line: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()

    async def wait(request_id: str, request: dict[str, Any], poll_interval: float) -> None:
        trigger = DeltaLeaseTrigger(lease_conn_id="delta_occ_leases", request_id=request_id,
                                    owner=request["owner"], request=request, poll_interval=poll_interval, settle=0.0)
        event = await anext(trigger.run())
        say({"request_id": request_id, "fired": time.time(), "payload": event.payload})

    async def run() -> None:
        tasks = [asyncio.create_task(wait(*w)) for w in waits]
        say({"started": len(tasks)})
        await asyncio.gather(*tasks)

    asyncio.run(run())


if __name__ == "__main__":
    main()
