/** Why a key header was refused; each maps to one problem type. */
export type KeyRejection = 'missing' | 'empty' | 'repeated' | 'malformed' | 'too-long' | 'invalid-characters';

export type KeyParseResult = { ok: true; key: string } | { ok: false; reason: KeyRejection; detail: string };
