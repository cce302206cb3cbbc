import { Socket } from 'node:net';

/*
 * Which message brokers this run has. Jest's global setup probes each once and
 * hands the answer to the workers through the environment; the suites that
 * need a broker (describeWithBroker in brokers.ts) run only where it answered.
 * No Jest import here: the global setup loads this file outside any test.
 */

/** The brokers of this machine (and CI's): RabbitMQ with guest/guest, NATS with JetStream. */
export const RABBITMQ_URL = process.env.RABBITMQ_URL ?? 'amqp://guest:guest@127.0.0.1:5672';
export const NATS_URL = process.env.NATS_URL ?? '127.0.0.1:4222';

export type BrokerName = 'rabbitmq' | 'nats';

export interface BrokerInfo {
  /** As a person names it. */
  title: string;
  url: string;
  /** The environment variable that points the tests at another one. */
  variable: string;
  defaultPort: number;
  /** How to start one on a development machine. */
  start: string;
}

export const BROKERS: Record<BrokerName, BrokerInfo> = {
  rabbitmq: {
    title: 'RabbitMQ',
    url: RABBITMQ_URL,
    variable: 'RABBITMQ_URL',
    defaultPort: 5672,
    start: 'rabbitmq-server -detached, or docker run -d -p 5672:5672 rabbitmq:4',
  },
  nats: {
    title: 'NATS JetStream',
    url: NATS_URL,
    variable: 'NATS_URL',
    defaultPort: 4222,
    start: 'nats-server -js, or docker run -d -p 4222:4222 nats -js',
  },
};

/** Where the global setup leaves its findings for the workers: `{"rabbitmq":true,"nats":false}`. */
export const REACHABLE_BROKERS_VARIABLE = 'IDEMPOTENCY_TEST_BROKERS';

/** With it set (CI sets `REQUIRE_BROKERS=1`), a broker that does not answer fails the run instead. */
export function brokersRequired(): boolean {
  const value = process.env.REQUIRE_BROKERS?.trim().toLowerCase();
  return value !== undefined && value !== '' && value !== '0' && value !== 'false';
}

/** The URL without its password, for messages. */
export function displayUrl(url: string): string {
  return url.replace(/(\/\/[^:/@]+:)[^@/]+@/, '$1***@');
}

function hostAndPort(broker: BrokerInfo): { host: string; port: number } {
  // NATS takes a comma-separated list, with or without a scheme; the first server stands for all.
  const first = broker.url.split(',')[0].trim();
  const url = new URL(/^[a-z][a-z0-9+.-]*:\/\//i.test(first) ? first : `tcp://${first}`);
  return { host: url.hostname.replace(/^\[(.*)\]$/, '$1'), port: Number(url.port || broker.defaultPort) };
}

/** True if something accepts a TCP connection where the broker should be. */
export function probeBroker(name: BrokerName, timeoutMs = 2_000): Promise<boolean> {
  const { host, port } = hostAndPort(BROKERS[name]);
  return new Promise((resolve) => {
    const socket = new Socket();
    const settle = (reachable: boolean) => {
      socket.destroy();
      resolve(reachable);
    };
    socket.setTimeout(timeoutMs, () => settle(false));
    socket.once('connect', () => settle(true));
    socket.once('error', () => settle(false));
    socket.connect(port, host);
  });
}

/** What the global setup found, as the workers read it; a broker nobody probed counts as there. */
export function brokerReachable(name: BrokerName): boolean {
  const found = process.env[REACHABLE_BROKERS_VARIABLE];
  if (!found) return true;
  return (JSON.parse(found) as Partial<Record<BrokerName, boolean>>)[name] !== false;
}
