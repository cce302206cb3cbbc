/**
 * `nest-idempotency-pg/jetstream`: a NATS JetStream transport for Nest
 * microservices with explicit acknowledgements. Apart from the core so that
 * only apps using it load @nats-io/* and @nestjs/microservices.
 */
export { JetStreamServer, type JetStreamServerOptions } from './jetstream.server.js';
export { JetStreamContext } from './jetstream.context.js';
