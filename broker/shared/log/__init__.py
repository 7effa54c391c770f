"""The log store: topics, partitions, segment files, shared by every worker process.

records.py   record-batch headers: parse, validate (CRC32C), rewrite the base offset
segment.py   one segment: a .log file of batches and a sparse .index of offset -> position
partition.py one partition: its segments, its shared state file (seqlock), the append lock
producers.py the idempotent-producer table kept in the partition's state file
topics.py    the topic registry: create, delete, list; a metadata epoch in shared memory
"""
