/**
 * Any JSON value. Spelled `NonNullable<unknown> | null` rather than `unknown`
 * because TypeORM's insert typings reject `unknown` members, and a recursive
 * JSON type makes them recurse too deeply for the compiler.
 */
export type JsonValue = NonNullable<unknown> | null;

/** What the `metadata` jsonb column holds. */
export type JsonObject = Record<string, JsonValue>;
