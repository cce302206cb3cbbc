import type { CaptureSettings, ResponseCapture } from './response-capture.js';
import { FastifyReplyCapture, hasCaptureHook } from './fastify-capture.js';
import { isFastifyReply } from './fastify-reply.js';
import { serverResponse } from './request-identity.js';
import { WireCapture } from './wire-capture.js';

/**
 * Starts holding the response of one request, as the platform sends it:
 * in Fastify's reply pipeline (before `@fastify/compress`), or at Node's
 * response under Express (before `compression`, which wraps it earlier).
 */
export function captureResponse(response: unknown, settings: CaptureSettings): ResponseCapture {
  if (isFastifyReply(response) && hasCaptureHook(response)) return new FastifyReplyCapture(response, settings);
  // A reply of a Fastify instance without the module's hook can still be held safely at reply.raw.
  return WireCapture.attach(serverResponse(response), settings);
}
