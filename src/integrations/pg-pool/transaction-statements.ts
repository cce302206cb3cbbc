/**
 * What an app's statement does to a transaction, read off its text: enough to
 * turn the app's own transactions into savepoints of the idempotent
 * execution's, and to keep a COMMIT or ROLLBACK of the app's from ever
 * reaching that transaction's connection.
 */
export type TransactionStatement =
  /** `BEGIN` / `START TRANSACTION`, with the isolation level it asks for, if any. */
  | { kind: 'begin'; isolation?: IsolationLevel; otherModes: boolean }
  | { kind: 'commit' }
  | { kind: 'rollback' }
  | { kind: 'set-isolation'; isolation: IsolationLevel }
  /** Anything else that ends or changes a transaction (`COMMIT AND CHAIN`, `PREPARE TRANSACTION`, `SET TRANSACTION READ ONLY`, ...). */
  | { kind: 'other-control' };

/** PostgreSQL's isolation levels as `current_setting('transaction_isolation')` spells them. */
export type IsolationLevel = 'read committed' | 'repeatable read' | 'serializable';

const ISOLATION = /^isolation\s+level\s+(read\s+uncommitted|read\s+committed|repeatable\s+read|serializable)\s*(.*)$/i;

/**
 * The transaction statement `text` is, or undefined for any other statement.
 * Comments and a trailing semicolon are allowed; a text of several
 * statements (a simple query may hold them) that holds a transaction
 * statement is `other-control` (refused by the caller), since it would end or
 * open a transaction as a whole.
 */
export function transactionStatementOf(text: string): TransactionStatement | undefined {
  const statements = statementsOf(text);
  const read = statements.map(classify);
  if (read.every((statement) => statement === undefined)) return undefined;
  return statements.length === 1 ? read[0] : { kind: 'other-control' };
}

function classify(statement: string): TransactionStatement | undefined {
  const words = statement.toLowerCase().replace(/\s+/g, ' ');
  if (/^(commit|end|rollback|abort)( (work|transaction))?$/.test(words))
    return words.startsWith('commit') || words.startsWith('end') ? { kind: 'commit' } : { kind: 'rollback' };
  const begin = /^(begin( work| transaction)?|start transaction)( (.*))?$/.exec(words);
  if (begin) {
    const modes = begin[4]?.trim() ?? '';
    if (!modes) return { kind: 'begin', otherModes: false };
    const isolation = ISOLATION.exec(modes);
    return isolation
      ? { kind: 'begin', isolation: levelOf(isolation[1]), otherModes: isolation[2].replace(/^,/, '').trim() !== '' }
      : { kind: 'begin', otherModes: true };
  }
  const set = /^set transaction (.*)$/.exec(words);
  if (set) {
    const isolation = ISOLATION.exec(set[1].trim());
    return isolation && isolation[2].trim() === ''
      ? { kind: 'set-isolation', isolation: levelOf(isolation[1]) }
      : { kind: 'other-control' };
  }
  if (/^(commit|end|rollback|abort)\b/.test(words) && !/^rollback (to|work to|transaction to)\b/.test(words))
    return { kind: 'other-control' };
  if (
    /^(prepare transaction|set session characteristics|set local transaction_isolation|set transaction_isolation)\b/.test(words)
  )
    return { kind: 'other-control' };
  return undefined;
}

/** PostgreSQL runs READ UNCOMMITTED as READ COMMITTED. */
function levelOf(spelled: string): IsolationLevel {
  const level = spelled.toLowerCase().replace(/\s+/g, ' ');
  return level === 'read uncommitted' ? 'read committed' : (level as IsolationLevel);
}

/**
 * The statements of `text` with their comments left out, split at the
 * semicolons outside literals, quoted names and comments (`'...'`, `E'...'`,
 * `"..."`, `$tag$...$tag$`, `-- ...`, `/* ... *\/`, not nested).
 */
export function statementsOf(text: string): string[] {
  const statements: string[] = [];
  let current = '';
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    let end: number;
    if (c === ';') {
      statements.push(current);
      current = '';
      i++;
      continue;
    }
    if (c === '-' && text[i + 1] === '-') {
      end = text.indexOf('\n', i);
      i = end < 0 ? text.length : end;
      current += ' ';
      continue;
    }
    if (c === '/' && text[i + 1] === '*') {
      end = text.indexOf('*/', i + 2);
      i = end < 0 ? text.length : end + 2;
      current += ' ';
      continue;
    }
    if (c === "'" || c === '"') end = closingQuote(text, i, c);
    else if (c === '$') {
      const tag = /^\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$/.exec(text.slice(i))?.[0];
      const close = tag ? text.indexOf(tag, i + tag.length) : -1;
      end = tag ? (close < 0 ? text.length : close + tag.length) : i + 1;
    } else end = i + 1;
    current += text.slice(i, end);
    i = end;
  }
  statements.push(current);
  return statements.map((statement) => statement.trim()).filter((statement) => statement.length > 0);
}

/** The index past the quote that closes the one at `start` (a doubled quote is part of the literal; `\\'` in `E'...'` too). */
function closingQuote(text: string, start: number, quote: string): number {
  const escapes = quote === "'" && /[eE]/.test(text[start - 1] ?? '');
  for (let i = start + 1; i < text.length; i++) {
    if (escapes && text[i] === '\\') i++;
    else if (text[i] === quote) {
      if (text[i + 1] === quote) i++;
      else return i + 1;
    }
  }
  return text.length;
}
