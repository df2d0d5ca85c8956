// Sends spans to an OTLP/HTTP endpoint with the official OpenTelemetry JavaScript exporter
// (@opentelemetry/exporter-trace-otlp-http, JSON encoding), as tests/test_collector.py runs it:
//
//   node tests/js/send-spans.js URL COUNT [--gzip] [--batch N]
//
// One trace: a root span "invoke_agent js-agent" and COUNT - 1 children "execute_tool tool_<i % 3>"
// with string, int, double, bool and array attributes. The bearer token, when needed, comes
// from $TREELLM_TOKEN. Prints one JSON line {"traceId", "spans", "exported", "failed"} and exits
// 1 when any export failed.
'use strict';

const { trace, ROOT_CONTEXT } = require('@opentelemetry/api');
const { BasicTracerProvider, BatchSpanProcessor } = require('@opentelemetry/sdk-trace-base');
const { resourceFromAttributes } = require('@opentelemetry/resources');
const { OTLPTraceExporter } = require('@opentelemetry/exporter-trace-otlp-http');

function parseArgs(argv) {
  const [url, countText, ...rest] = argv;
  const count = Number.parseInt(countText, 10);
  if (!url || !Number.isInteger(count) || count < 1) {
    throw new Error('usage: node send-spans.js URL COUNT [--gzip] [--batch N]');
  }
  const options = { url, count, gzip: false, batch: 64 };
  for (let i = 0; i < rest.length; i += 1) {
    if (rest[i] === '--gzip') options.gzip = true;
    else if (rest[i] === '--batch') options.batch = Number.parseInt(rest[(i += 1)], 10);
    else throw new Error(`unknown option ${rest[i]}`);
  }
  return options;
}

// Counts the outcome of every export the batch processor makes (it swallows failures).
class CountingExporter {
  constructor(inner) {
    this.inner = inner;
    this.exported = 0;
    this.failed = 0;
    this.errors = [];
  }

  export(spans, done) {
    this.inner.export(spans, (result) => {
      if (result.code === 0) this.exported += spans.length;
      else {
        this.failed += spans.length;
        this.errors.push(String(result.error && result.error.message));
      }
      done(result);
    });
  }

  shutdown() {
    return this.inner.shutdown();
  }

  forceFlush() {
    return this.inner.forceFlush ? this.inner.forceFlush() : Promise.resolve();
  }
}

async function main() {
  const options = parseArgs(process.argv.slice(2));
  const headers = process.env.TREELLM_TOKEN ? { Authorization: `Bearer ${process.env.TREELLM_TOKEN}` } : {};
  const exporter = new CountingExporter(
    new OTLPTraceExporter({ url: options.url, headers, compression: options.gzip ? 'gzip' : 'none' }),
  );
  const provider = new BasicTracerProvider({
    resource: resourceFromAttributes({ 'service.name': 'js-client', 'deployment.environment': 'test' }),
    spanProcessors: [new BatchSpanProcessor(exporter, { maxExportBatchSize: options.batch, scheduledDelayMillis: 50 })],
  });
  const tracer = provider.getTracer('treellm-js-test', '1.0.0');
  const root = tracer.startSpan('invoke_agent js-agent', {
    attributes: { 'gen_ai.operation.name': 'invoke_agent', 'gen_ai.agent.name': 'js-agent' },
  });
  const parent = trace.setSpan(ROOT_CONTEXT, root);
  for (let i = 1; i < options.count; i += 1) {
    const child = tracer.startSpan(
      `execute_tool tool_${i % 3}`,
      {
        attributes: {
          'gen_ai.operation.name': 'execute_tool',
          'gen_ai.tool.name': `tool_${i % 3}`,
          'js.index': i,
          'js.ratio': i / 4,
          'js.even': i % 2 === 0,
          'js.tags': ['alpha', `n${i}`],
        },
      },
      parent,
    );
    child.addEvent('tool:done', { 'js.index': i });
    child.end();
  }
  root.end();
  await provider.forceFlush();
  await provider.shutdown();
  const summary = {
    traceId: root.spanContext().traceId,
    spans: options.count,
    exported: exporter.exported,
    failed: exporter.failed,
    errors: exporter.errors.slice(0, 3),
  };
  process.stdout.write(`${JSON.stringify(summary)}\n`);
  process.exitCode = exporter.failed === 0 && exporter.exported === options.count ? 0 : 1;
}

main().catch((error) => {
  process.stderr.write(`send-spans: ${error && error.stack ? error.stack : error}\n`);
  process.exitCode = 2;
});
