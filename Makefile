# `make run` and `make test` do all set-up on a fresh machine: a virtual environment in .venv,
# the project installed into it (editable), then the broker or the test suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LOADGEN := loadtest/bin/rrclient loadtest/bin/connclient

.PHONY: install run test bench fuzz soak loadgen loadtest report java haproxy prometheus chromium \
	kafka kafka-run kafka-tool compare compat go-clients clean

install: $(STAMP)

$(STAMP): pyproject.toml broker/shared/log/_recordwalk.c workers/_frames.c workers/_counts.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,pipeline]'
	touch $(STAMP)

# The PySpark pipeline needs a Java runtime (17 or newer), the project's only system need.
java:
	@command -v java >/dev/null 2>&1 || { echo "Spark needs Java 17+: install it with" \
	  "'apt-get install default-jre-headless' (Debian/Ubuntu)" >&2; exit 1; }

# Apache Kafka 4.4.0 (broker, Java clients, tools, Streams) from Maven Central into compat/lib,
# and the Java programs of compat/src compiled against it: the reference the comparison and the
# compatibility tests run beside this broker.
KAFKA_STAMP := compat/lib/.resolved
kafka: $(KAFKA_STAMP)

$(KAFKA_STAMP): compat/pom.xml $(shell find compat/src -name '*.java' 2>/dev/null)
	@command -v java >/dev/null 2>&1 || { echo "Apache Kafka needs Java 17+: install it with" \
	  "'apt-get install default-jdk-headless' (Debian/Ubuntu)" >&2; exit 1; }
	@command -v mvn >/dev/null 2>&1 || { echo "Apache Kafka's jars come through Maven: install" \
	  "it with 'apt-get install maven' (Debian/Ubuntu)" >&2; exit 1; }
	mvn -q -B -f compat/pom.xml package
	touch $@

# The Go clients' checks (franz-go and Sarama, tests/compat/test_go_clients.py) in compat/bin, built
# from compat/go with the module versions its go.sum pins, fetched from the Go module proxy.
go-clients:
	@command -v go >/dev/null 2>&1 || { echo "the Go client tests need Go: install it with" \
	  "'apt-get install golang-go' (Go 1.21 or newer fetches the 1.26 toolchain go.mod names)" >&2; \
	  exit 1; }
	cd compat/go && go build -buildvcs=false -o ../bin/ ./cmd/...

# Debian packages the system tests drive for real, installed when missing (as root), else the
# command that does it is printed: HAProxy in front of the broker (PROXY protocol), Prometheus
# and promtool (scraping, alert rules), Chromium (the report in a headless browser).
define debian_package
@command -v $(1) >/dev/null 2>&1 || test -x /usr/sbin/$(1) || { \
  echo "installing Debian's $(2) package: $(3)" >&2; \
  export DEBIAN_FRONTEND=noninteractive; \
  apt-get install -y --no-install-recommends $(2) >/dev/null 2>&1 || \
  { apt-get update >/dev/null 2>&1 && \
    apt-get install -y --no-install-recommends $(2) >/dev/null 2>&1; } || \
  { echo "the tests need $(2): install it with 'apt-get install $(2)'" >&2; exit 1; }; }
endef

haproxy:
	$(call debian_package,haproxy,haproxy,the PROXY protocol tests put it in front of the broker)

prometheus:
	$(call debian_package,promtool,prometheus,alert rule tests and a real scraping server)

chromium:
	$(call debian_package,chromium,chromium,the report is checked in a headless browser)

run: install
	mkdir -p data
	$(PY) -m broker --config config/server.properties

# The import contracts first (pyproject.toml: which process may import what), then the suite.
test: install loadgen java kafka go-clients haproxy prometheus chromium
	$(VENV)/bin/lint-imports --no-logo
	$(PY) -m pytest -q -m 'not long' tests

# A single-node KRaft Apache Kafka on 127.0.0.1 (ephemeral ports, a temporary directory) until
# Ctrl-C; `make kafka-tool TOOL=kafka-topics ARGS="--bootstrap-server 127.0.0.1:9092 --list"`
# runs one of Kafka's tools by its script's name or by class.
kafka-run: install kafka
	$(PY) -m loadtest.apache_kafka

TOOL ?= kafka-broker-api-versions
ARGS ?= --help
kafka-tool: install kafka
	$(PY) -m loadtest.apache_kafka tool $(TOOL) $(ARGS)

# The same scenarios against this broker and Apache Kafka in one run: a table of ratios
# (ours / Kafka's) and reports/compare.json.  COMPARE_ARGS="--only produce" for a part.
COMPARE_ARGS ?=
compare: install loadgen kafka
	$(PY) -m pip install --quiet -e '.[profile]'
	$(PY) -m loadtest.compare $(COMPARE_ARGS)

# The long compatibility set: Kafka's Java clients, tools and Streams, and the Go clients,
# against this broker (`make test` runs a short version of each), and the report's job on a
# Spark standalone cluster (`make test` runs it in local mode).
compat: install loadgen kafka go-clients
	$(PY) -m pytest -q -m long tests

loadgen: $(LOADGEN)

loadtest/bin/%: loadtest/%.c
	mkdir -p loadtest/bin
	$${CC:-gcc} -O2 -Wall -o $@ $<

# Every fuzz target (tests/fuzz) with atheris for FUZZ_SECONDS each; findings land in
# fuzz-findings/.  `make test` runs each for a few seconds.
FUZZ_SECONDS ?= 60
FUZZ_JOBS ?= 2
fuzz: install
	$(PY) -m tests.fuzz --seconds $(FUZZ_SECONDS) --jobs $(FUZZ_JOBS)

# Rotating populations of client ids, groups and producers against one broker for
# SOAK_SECONDS; fails if a process's memory grew by more than 10 % after the first minute.
SOAK_SECONDS ?= 600
soak: install
	$(PY) -m loadtest.soak --seconds $(SOAK_SECONDS)

bench: install loadgen java
	$(PY) -m loadtest.bench

# A short incident on a real broker (storm, throttled producer, large-request burst; 127.0.0.1
# only, about 25 s), then the PySpark report about it: prints the report's path.
report: install java
	$(PY) -m loadtest.demo --out reports/demo

# A short connection storm with locust against a broker started here on an ephemeral port of
# 127.0.0.1 (50 users, 10 s; LOCUST_ARGS="-t 30s -u 200" to change).  Fails if a request failed.
LOCUST_ARGS ?=
loadtest: install
	$(PY) -m pip install --quiet -e '.[load]'
	@d=$$(mktemp -d); \
	$(PY) -m broker --override listeners=PLAINTEXT://127.0.0.1:0 --override log.dirs=$$d/logs \
	  --override prometheus.listen=127.0.0.1:0 --override num.network.threads=2 2>$$d/broker.log & \
	pid=$$!; trap 'kill -TERM '$$pid' 2>/dev/null; wait '$$pid'; rm -rf '$$d EXIT; \
	for i in $$(seq 300); do grep -q 'broker ready' $$d/broker.log && break; \
	  kill -0 $$pid 2>/dev/null || break; sleep 0.1; done; \
	port=$$(sed -n 's/.*listening listener=PLAINTEXT address=127\.0\.0\.1:\([0-9][0-9]*\).*/\1/p' $$d/broker.log | head -n 1); \
	if ! grep -q 'broker ready' $$d/broker.log || [ -z "$$port" ]; then cat $$d/broker.log; echo 'loadtest: broker did not start' >&2; exit 1; fi; \
	$(VENV)/bin/locust -f loadtest/locustfile.py --config loadtest/locust.conf --host tcp://127.0.0.1:$$port $(LOCUST_ARGS)

clean:
	rm -rf $(VENV) loadtest/bin .pytest_cache reports compat/lib compat/target compat/bin
