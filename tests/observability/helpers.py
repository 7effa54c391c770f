"""Helpers of the observability tests: the JVM options of the Spark the pipeline's tests run."""

# The tests' JVMs compile with C1 only and collect with the serial collector: each job here is
# small, and C2's compiler threads and a parallel collector took a third of Spark's CPU on two
# cores (the pipeline's tests without the cluster test: 167 -> 115 s of CPU).  No answer
# depends on them.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def submit_args(executors: bool = False) -> str:
    """PYSPARK_SUBMIT_ARGS giving the driver's JVM (and the executors') TEST_JVM_OPTIONS."""
    given = f"--driver-java-options '{TEST_JVM_OPTIONS}'"
    if executors:
        given += f" --conf 'spark.executor.extraJavaOptions={TEST_JVM_OPTIONS}'"
    return given + " pyspark-shell"
