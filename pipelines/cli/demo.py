"""Demo data: a few thousand duties over many timezones, every frequency, kind and state."""

import random
import uuid
from datetime import date, timedelta

from sqlalchemy import Engine, func, insert, select

from rota.resources.database.schema import FREQUENCIES, duty, job

# Zones over the whole span of UTC offsets, -11 to +14, the odd ones among them (+05:45,
# +12:45, -09:30, Lord Howe's half-hour DST): the demo and the benchmarks (benchmarks/data.py)
# spread their duties over these.
ZONES = [
    "UTC", "Europe/London", "Europe/Paris", "Europe/Berlin", "Europe/Athens", "Europe/Moscow",
    "Europe/Lisbon", "Africa/Cairo", "Africa/Lagos", "Africa/Johannesburg", "Africa/Nairobi",
    "Asia/Dubai", "Asia/Karachi", "Asia/Kolkata", "Asia/Kathmandu", "Asia/Dhaka", "Asia/Yangon",
    "Asia/Bangkok", "Asia/Shanghai", "Asia/Tokyo", "Asia/Seoul", "Australia/Perth",
    "Australia/Adelaide", "Australia/Darwin", "Australia/Sydney", "Australia/Lord_Howe",
    "Pacific/Auckland", "Pacific/Chatham", "Pacific/Tongatapu", "Pacific/Kiritimati",
    "Pacific/Honolulu", "Pacific/Marquesas", "Pacific/Pago_Pago", "America/Anchorage",
    "America/Los_Angeles", "America/Denver", "America/Chicago", "America/New_York",
    "America/Caracas", "America/Halifax", "America/St_Johns", "America/Sao_Paulo",
    "America/Santiago", "Atlantic/Azores", "Atlantic/Cape_Verde",
]
TITLES = ["Water the plants", "Check the fire extinguishers", "Send the invoices",
          "Back up the laptops", "Review the rota", "Pay the rent", "Renew the certificates",
          "Clean the fridge", "Test the alarms", "File the VAT return"]
WORKSPACES = [uuid.UUID(int=n) for n in range(1, 6)]


def demo_duties(count: int = 3000, seed: int = 2026, today: date | None = None) -> list[dict]:
    rng = random.Random(seed)
    today = today or date.today()
    rows = []
    for n in range(count):
        standing = rng.random() < 0.05
        effective_from = today - timedelta(days=rng.randint(0, 800)) if rng.random() < 0.3 else None
        effective_to = today + timedelta(days=rng.randint(-200, 400)) if rng.random() < 0.15 else None
        if effective_from and effective_to and effective_to < effective_from:
            effective_to = effective_from + timedelta(days=rng.randint(0, 90))
        rows.append({
            "workspace_id": rng.choice(WORKSPACES),
            "title": f"{rng.choice(TITLES)} #{n + 1}",
            "kind": "standing" if standing else "recurring",
            "frequency": None if standing else rng.choice(FREQUENCIES),
            "timezone": rng.choice(ZONES),
            "lead_days": rng.choice([0, 0, 0, 1, 3, 7, 14, 30]),
            "effective_from": effective_from,
            "effective_to": effective_to,
            "state": rng.choices(["active", "paused", "archived"], weights=[90, 7, 3])[0],
        })
    return rows


def load_demo(engine: Engine) -> int:
    """Load the demo duties and the demo cron job into a database that has neither duties
    nor jobs; returns how many duties were loaded (0: the database was not empty, and
    nothing in it was touched). The job, `noop`, runs every five minutes in a DST zone
    and on every `demo.ping` event."""
    from rota.pipelines.queue.jobs import register_job

    with engine.begin() as conn:
        if conn.execute(select(func.count()).select_from(duty)).scalar_one() or \
                conn.execute(select(func.count()).select_from(job)).scalar_one():
            return 0
        rows = demo_duties()
        conn.execute(insert(duty), rows)
        register_job(conn, "noop", schedule="*/5 * * * *", timezone="Europe/London", event_type="demo.ping")
        return len(rows)
