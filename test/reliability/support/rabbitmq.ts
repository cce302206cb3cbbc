import { execFile } from 'node:child_process';
import { promisify } from 'node:util';

const execFileAsync = promisify(execFile);

/**
 * Messages of `queue` ready or delivered and unacknowledged, as
 * `rabbitmqctl` (root, on the broker's machine) counts them: AMQP's
 * `checkQueue` counts only the ready ones.
 */
export async function queueMessages(queue: string): Promise<number> {
  const { stdout } = await execFileAsync('rabbitmqctl', ['list_queues', '-q', '--no-table-headers', 'name', 'messages']);
  const line = stdout.split('\n').find((l) => l.split(/\s+/)[0] === queue);
  return line ? Number(line.trim().split(/\s+/)[1]) : 0;
}
