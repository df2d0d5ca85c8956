"""Reading and deriving: trace files in, the facts of runs out.

The first room of the data flow (formats -> derive -> store -> analysis -> report/dashboard):

- ``formats/``: one module per input format (OTLP JSON/JSONL/protobuf, the SDK's exporters,
  coding agents' trajectories) and their registry, each converting to OTLP ``TracesData``;
- ``transform.py``: the staging SQL generated from the conventions (where other frameworks keep a
  span's role and a call's facts, :mod:`treellm.telemetry.conventions`) and the validator's rules;
- ``foreign.py``: other frameworks' spans' facts moved in and out of DuckDB as columns, each
  distinct key ruled once (signatures, call keys, repeat chains);
- ``trees.py``: where a run starts and its tree, paths and ordinals (pure);
- ``trees_sql.py``: the same rule as SQL over whole batches, for the traces of one run and one path.

It never opens, migrates or queries a store (an import-linter contract): ``treellm.store``
holds the rooms for storing and querying (schema, views, backends, journal) and calls in here.
"""
