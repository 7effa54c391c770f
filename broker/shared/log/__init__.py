"""The log store: topics, partitions and their files, used by the parent and every worker.

topics.py          the topic registry: create, delete, list; the partition handles of a process
topic_config.py    topic-level configs: declared, validated, turned into a topic's LogSettings
settings.py        LogSettings: what a partition needs of the configuration
partition.py       one partition: appends, markers, reads, flushes; coordinates the rest
partition_state.py the partition's state file: its words, their mapping, the append lock
segment_cache.py   the segments of a partition one process holds open, refreshed on change
segment.py         one segment: a .log of batches, a sparse .index and a .timeindex
recovery.py        a partition's state rebuilt from its files (start-up, a writer's death)
retention.py       the log start: retention by size and age, DeleteRecords, its checkpoint
time_lookup.py     ListOffsets by timestamp and the largest timestamp, via the time index
producers.py       the idempotent-producer table, a mapped file of its own per partition
control_batches.py transaction markers, the aborted-transaction index, the LSO's word
records.py         record batches: parse, validate (CRC32C, per record), rewrite the header
_recordwalk.c      the per-record walk of records.py in C (the produce path)
record_errors.py   Kafka's record_errors (KIP-467): which records broke which rule
compression.py     the codecs the broker writes (a topic's compression.type)
compaction.py      log compaction of closed segments (run by the parent, off the request path)
files.py           the bounded, least-recently-used set of log files a thread holds open
mapping.py         shared mappings of files that hold no descriptor
"""
