import { randomBytes, timingSafeEqual } from 'node:crypto';

/** The cookie that carries the board's anti-forgery token; the page echoes it in `BOARD_CSRF_HEADER`. */
export const BOARD_CSRF_COOKIE = 'idempotency_board_csrf';
export const BOARD_CSRF_HEADER = 'x-board-csrf';

const TOKEN = /^[A-Za-z0-9_-]{43}$/;

type Headers = Record<string, string | string[] | undefined>;

function single(value: string | string[] | undefined): string | undefined {
  return typeof value === 'string' ? value : undefined;
}

/** The board's token from the request's cookies, if it has a well-formed one. */
export function csrfCookieOf(headers: Headers): string | undefined {
  const cookies = single(headers.cookie);
  if (!cookies) return undefined;
  for (const pair of cookies.split(';')) {
    const at = pair.indexOf('=');
    if (at > 0 && pair.slice(0, at).trim() === BOARD_CSRF_COOKIE) {
      const value = pair.slice(at + 1).trim();
      return TOKEN.test(value) ? value : undefined;
    }
  }
  return undefined;
}

export function newCsrfToken(): string {
  return randomBytes(32).toString('base64url');
}

/**
 * The cookie line for `token`: HttpOnly (the page reads the token from its
 * own HTML, never from the cookie), SameSite=Strict (another site's request
 * never carries it), limited to the board's path.
 */
export function csrfCookieLine(token: string, path: string, secure: boolean): string {
  return `${BOARD_CSRF_COOKIE}=${token}; Path=${path}; HttpOnly; SameSite=Strict${secure ? '; Secure' : ''}`;
}

/**
 * A double-submit check: the header must equal the cookie. A page of another
 * site can make the browser send the cookie (SameSite aside) but cannot read
 * it, nor set a custom header on a cross-site request without a CORS
 * preflight the app does not grant. Where the browser says where the request
 * came from (`Sec-Fetch-Site`), that must be this origin too. `Origin` is not
 * compared with `Host`: a reverse proxy may rewrite the host, and the token
 * already decides.
 */
export function csrfAccepted(headers: Headers): boolean {
  const site = single(headers['sec-fetch-site']);
  if (site !== undefined && site !== 'same-origin') return false;
  const cookie = csrfCookieOf(headers);
  const header = single(headers[BOARD_CSRF_HEADER]);
  if (!cookie || !header || header.length !== cookie.length) return false;
  return timingSafeEqual(Buffer.from(header), Buffer.from(cookie));
}
