import { Injectable } from '@nestjs/common';
import { randomBytes } from 'node:crypto';

/** The sample's board sign-in cookie: an opaque session id, never the API key. */
export const BOARD_SESSION_COOKIE = 'sample_board_session';
/** Where the board is mounted, and so the only path the session cookie is sent to. */
export const BOARD_PATH = '/board';
/** How long a sign-in lasts (8 h), whatever the browser does with its session cookie. */
export const BOARD_SESSION_TTL_MS = 8 * 60 * 60 * 1000;

const SESSION_ID = /^[A-Za-z0-9_-]{43}$/;

type Headers = Record<string, string | string[] | undefined>;

/**
 * The board's sign-ins, in this process's memory: a random id per sign-in,
 * mapped to the tenant of the API key it was made with. A restart signs
 * everyone out, and behind a load balancer each instance knows only its own:
 * a real app keeps sessions where its instances share them.
 */
@Injectable()
export class BoardSessions {
  private readonly sessions = new Map<string, { tenant: string; expires: number }>();

  open(tenant: string): string {
    this.prune();
    const id = randomBytes(32).toString('base64url');
    this.sessions.set(id, { tenant, expires: Date.now() + BOARD_SESSION_TTL_MS });
    return id;
  }

  /** The tenant of the request's session cookie, if it names a live session. */
  tenantOf(headers: Headers): string | undefined {
    const id = sessionIdOf(headers);
    if (id === undefined) return undefined;
    const session = this.sessions.get(id);
    if (!session) return undefined;
    if (session.expires <= Date.now()) {
      this.sessions.delete(id);
      return undefined;
    }
    return session.tenant;
  }

  close(headers: Headers): void {
    const id = sessionIdOf(headers);
    if (id !== undefined) this.sessions.delete(id);
  }

  private prune(): void {
    const now = Date.now();
    for (const [id, session] of this.sessions) if (session.expires <= now) this.sessions.delete(id);
  }
}

function sessionIdOf(headers: Headers): string | undefined {
  const cookies = typeof headers.cookie === 'string' ? headers.cookie : undefined;
  if (!cookies) return undefined;
  for (const pair of cookies.split(';')) {
    const at = pair.indexOf('=');
    if (at > 0 && pair.slice(0, at).trim() === BOARD_SESSION_COOKIE) {
      const value = pair.slice(at + 1).trim();
      return SESSION_ID.test(value) ? value : undefined;
    }
  }
  return undefined;
}

/** HttpOnly (no script reads it), SameSite=Strict (no other site's request carries it), sent to the board only. */
export function sessionCookieLine(id: string, secure: boolean): string {
  return `${BOARD_SESSION_COOKIE}=${id}; Path=${BOARD_PATH}; HttpOnly; SameSite=Strict${secure ? '; Secure' : ''}`;
}

export function clearedSessionCookieLine(secure: boolean): string {
  return `${BOARD_SESSION_COOKIE}=; Path=${BOARD_PATH}; HttpOnly; SameSite=Strict; Max-Age=0${secure ? '; Secure' : ''}`;
}
