import type { Socket } from 'node:net';
import { LoopbackProxy } from '../../support/loopback-proxy.js';

/** PostgreSQL's CommandComplete message for COMMIT: 'C', int32 length 11, "COMMIT\0". */
const COMMIT_COMPLETE = Buffer.from([0x43, 0, 0, 0, 11, ...Buffer.from('COMMIT'), 0]);
const ENDS_TRANSACTION = [COMMIT_COMPLETE, Buffer.from('ROLLBACK\0')];
const CHARGE_INSERT = Buffer.from('INSERT INTO "charges"');

/**
 * A loopback TCP proxy between an app and PostgreSQL that makes a commit's
 * outcome unknown to the app: when armed, it lets the COMMIT of a transaction
 * that inserted a charge reach the server, swallows the server's "COMMIT"
 * answer and cuts the connection. The charge is committed; the app only
 * sees its connection die during COMMIT.
 */
export class CommitCutter extends LoopbackProxy {
  private armed = 0;
  /** Commits whose answer was swallowed. */
  cuts = 0;

  /** Cut the next `count` charge commits. */
  arm(count: number): void {
    this.armed = count;
  }

  protected relay(app: Socket, database: Socket): void {
    let insertedCharge = false;
    app.on('data', (chunk: Buffer) => {
      if (chunk.includes(CHARGE_INSERT)) insertedCharge = true;
      database.write(chunk);
    });
    database.on('data', (chunk: Buffer) => {
      if (insertedCharge && this.armed > 0 && chunk.includes(COMMIT_COMPLETE)) {
        this.armed--;
        this.cuts++;
        database.destroy();
        app.destroy();
        return;
      }
      if (ENDS_TRANSACTION.some((marker) => chunk.includes(marker))) insertedCharge = false;
      app.write(chunk);
    });
    app.on('end', () => database.end());
    database.on('end', () => app.end());
  }
}
