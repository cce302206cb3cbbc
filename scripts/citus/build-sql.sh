#!/usr/bin/env bash
# Compiles only the module's SQL builders (no Nest, no app) into .citus-build/, so the probe scripts
# send the statements byte-identical to what the module sends. A few seconds of tsc.
set -euo pipefail
cd "$(dirname "$0")/../.."
npx tsc --ignoreConfig --outDir .citus-build --rootDir src --module nodenext --moduleResolution nodenext --target es2022 \
  --skipLibCheck --experimentalDecorators --emitDecoratorMetadata --esModuleInterop --types node \
  src/store/sql.ts src/store/key-store.sql.ts src/ledger/effect-ledger.sql.ts \
  src/store/partitioned/partitioned-key-table.sql.ts src/outbox/outbox.store.ts src/board/board.queries.ts \
  src/store/postgres/statements.ts src/store/postgres/pipelined.ts src/store/citus/citus.sql.ts src/store/citus/citus-layout-check.ts
echo '{"type":"module"}' > .citus-build/package.json
