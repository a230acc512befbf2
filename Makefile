# The two commands of the README: `make run` and `make test`. Everything else is a step of theirs.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup gen run test check bench lint release-contract clean node-sdk node-clients java-clients go-clients rocketmq-broker console-browser

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip==25.3
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps -e .
	bash scripts/ensure_java.sh
	touch $(STAMP)

# Python stubs + type stubs from protos/ (never committed, never edited).
gen: $(STAMP)
	$(PY) scripts/gen_protos.py

setup: gen

# The main job: services on loopback, a message sent and found by id, key and unique key.
run: setup
	$(PY) -m scripts.demo

# The official RocketMQ 5 Node.js SDK, exactly as package-lock.json pins it (e2e tests, README).
NODE_SDK := tests/e2e/node/node_modules/.package-lock.json
$(NODE_SDK): tests/e2e/node/package.json tests/e2e/node/package-lock.json
	cd tests/e2e/node && npm ci --no-audit --no-fund --loglevel=error

node-sdk: $(NODE_SDK)

# npm clients the e2e tests run (ali-ons: RocketMQ 4 in pure JavaScript), exactly as locked.
NODE_STAMP := tests/node/node_modules/.installed
$(NODE_STAMP): tests/node/package.json tests/node/package-lock.json
	cd tests/node && npm ci --no-audit --no-fund --loglevel=error
	touch $(NODE_STAMP)

node-clients: $(NODE_STAMP)

# Apache RocketMQ's own Java clients and mqadmin, exactly as tests/java/pom.xml pins them, and
# the e2e tests' small Java drivers (tests/java/src), compiled; jars copied to
# tests/java/target/dependency. Maven's local repository is the default ~/.m2: a fresh clone on
# the same machine (CI's) builds offline once the jars were fetched.
JAVA_STAMP := tests/java/target/.built
$(JAVA_STAMP): tests/java/pom.xml $(shell find tests/java/src -name '*.java' 2>/dev/null)
	@command -v mvn >/dev/null || (echo "java-clients: Maven (mvn) and a JDK 17 are needed" >&2; exit 1)
	mvn -q -B -Dstyle.color=never -f tests/java/pom.xml compile
	touch $(JAVA_STAMP)

java-clients: $(JAVA_STAMP)

# Apache RocketMQ's own NameServer and broker (4.9.7: Maven Central's last 4.x broker; and
# 5.3.3), run by the tests that follow a live broker's store (tests/e2e/rocketmq_broker.py); a
# pom of its own each (tests/java/broker/pom.xml, tests/java/broker5/pom.xml), jars copied to
# their target/dependency.
BROKER_STAMP := tests/java/broker/target/.built
$(BROKER_STAMP): tests/java/broker/pom.xml tests/java/broker5/pom.xml
	@command -v mvn >/dev/null || (echo "rocketmq-broker: Maven (mvn) and a JDK 17 are needed" >&2; exit 1)
	mvn -q -B -Dstyle.color=never -f tests/java/broker/pom.xml package
	mvn -q -B -Dstyle.color=never -f tests/java/broker5/pom.xml package
	touch $(BROKER_STAMP)

rocketmq-broker: $(BROKER_STAMP)

# Apache RocketMQ's Go client (rocketmq-client-go/v2, exactly as tests/go/go.mod and go.sum pin
# it) and the e2e tests' driver, built into tests/go/bin/ (ignored). The Go module proxy (or the
# module cache, offline once fetched) supplies the modules.
GO_DRIVER := tests/go/bin/rmq4
$(GO_DRIVER): tests/go/go.mod tests/go/go.sum $(shell find tests/go -name '*.go' 2>/dev/null)
	@command -v go >/dev/null || (echo "go-clients: Go (1.21 or later) is needed" >&2; exit 1)
	cd tests/go && go build -mod=readonly -o bin/rmq4 ./rmq4

go-clients: $(GO_DRIVER)

# quarry-console's browser tests (tests/e2e/test_console_browser.py): Debian's Chromium
# (scripts/ensure_chromium.sh) and Playwright's driver, playwright-core exactly as
# tests/console/package-lock.json pins it (no browser download: the tests use /usr/bin/chromium).
CONSOLE_STAMP := tests/console/node_modules/.installed
$(CONSOLE_STAMP): tests/console/package.json tests/console/package-lock.json scripts/ensure_chromium.sh
	bash scripts/ensure_chromium.sh
	cd tests/console && npm ci --no-audit --no-fund --loglevel=error
	touch $(CONSOLE_STAMP)

console-browser: $(CONSOLE_STAMP)

# The whole suite: unit, contract (protos, golden vectors, buf), e2e (real processes).
test: setup node-sdk node-clients java-clients go-clients rocketmq-broker console-browser
	$(PY) -m pytest -q

# The inner loop's fast lane: unit and contract tests (in process, no services started).
check: setup
	$(PY) -m pytest -q tests/unit tests/contract

# Static checks alone (make check and make test run them too, as tests/contract/test_lint.py and test_types.py).
lint: setup
	$(VENV)/bin/buf lint
	$(VENV)/bin/ruff check --select E9,F --extend-exclude quarry/v1,node_modules services formats clients scripts pipeline bench quarry tests
	$(VENV)/bin/mypy

# Only when a contract change is released: the image `buf breaking` compares protos/ against
# (tests/contract/test_protos.py). Commit it with the release, never to silence a failing check.
release-contract: setup
	$(VENV)/bin/buf lint
	$(VENV)/bin/buf breaking --against protos/quarry.v1.binpb || \
	  (echo "breaking change against the released contract: needs a new package version (quarry.v2)"; exit 1)
	$(VENV)/bin/buf build -o protos/quarry.v1.binpb

clean:
	rm -rf $(VENV) quarry/v1/*_pb2*.py quarry/v1/*_pb2*.pyi
