// Runs statements read from stdin (blocks ended by a line ";;") one by one, autocommit, on CITUS_URL,
// and prints for each its first line and what it answered (rows, or the error's SQLSTATE and text).
import pg from 'pg';

const url = process.env.CITUS_URL ?? 'postgres://postgres@127.0.0.1:9700/postgres';
const input = await new Promise((resolve) => {
  let text = '';
  process.stdin.on('data', (chunk) => (text += chunk)).on('end', () => resolve(text));
});
const statements = input.split(/\n;;\n?/).map((s) => s.trim()).filter(Boolean);
const client = new pg.Client(url);
client.on('notice', (n) => console.log(`   NOTICE: ${n.message}`));
await client.connect();
for (const statement of statements) {
  const head = statement.split('\n')[0].slice(0, 110);
  try {
    const result = await client.query(statement);
    const rows = (Array.isArray(result) ? result.at(-1) : result).rows ?? [];
    console.log(`ok    ${head}${rows.length ? `\n      -> ${JSON.stringify(rows).slice(0, 300)}` : ''}`);
  } catch (error) {
    console.log(`ERROR ${head}\n      -> ${error.code} ${error.message}${error.detail ? ` DETAIL: ${error.detail}` : ''}${error.hint ? ` HINT: ${error.hint}` : ''}`);
  }
}
await client.end();
