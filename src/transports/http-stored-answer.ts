import { CommitRefusedError } from '../core/errors.js';
import type { EngineOutcome } from '../core/work.js';
import { serverResponse } from '../http/request-identity.js';
import type { ResponseCapture } from '../http/response-capture.js';
import { REPLAYED_HEADER } from '../idempotency.constants.js';
import type { OnceSubscriber } from './once-subscriber.js';

/** Answers an HTTP request whose outcome was stored before (a replay) or instead of its own (a stored failure). */
export function answerStored(
  outcome: Exclude<EngineOutcome<unknown>, { kind: 'executed' }>,
  wire: ResponseCapture,
  out: OnceSubscriber,
  response: unknown,
): void {
  if (outcome.kind === 'replayed') {
    // Set now, so the app's outer interceptors can tell a replay from the response they are handed.
    serverResponse(response).setHeader(REPLAYED_HEADER, 'true');
    wire.replace(outcome.response, [[REPLAYED_HEADER, 'true']]);
    // Nest still runs the app's outer interceptors and sends; the wire swaps in the stored bytes.
    out.emit(undefined);
  } else if (outcome.kind === 'failure-stored' && outcome.error instanceof CommitRefusedError) {
    // What the wire holds is the success that never committed; the stored answer goes out instead.
    wire.replace(outcome.response);
  } else {
    wire.release();
  }
}
