"""Operations: the trace context a job was enqueued under, and the indexes the health figures read.

``trace_context`` is a nullable jsonb column (the W3C ``traceparent``/``tracestate``
carrier), written only when OpenTelemetry is installed and a span is recording; the
seed's statements never name it, so they run unchanged. It is not a model field: only
``axa_django.tracing`` reads or writes it. The two partial indexes let the health
figures (``jobhealth``, the metrics view, the live dashboard) find per-queue ready rows
and recently finished rows by index descent, whatever the table holds.
"""

from django.db import migrations

FORWARD = """
ALTER TABLE axa_queue ADD COLUMN IF NOT EXISTS trace_context jsonb;
CREATE INDEX IF NOT EXISTS axa_queue_ready_queue ON axa_queue (queue, run_at) WHERE status = 'queued';
CREATE INDEX IF NOT EXISTS axa_queue_finished ON axa_queue (finished_at) WHERE finished_at IS NOT NULL;
"""
BACKWARD = """
DROP INDEX IF EXISTS axa_queue_finished;
DROP INDEX IF EXISTS axa_queue_ready_queue;
ALTER TABLE axa_queue DROP COLUMN IF EXISTS trace_context;
"""


class Migration(migrations.Migration):
    dependencies = [("axa_django", "0001_initial")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
