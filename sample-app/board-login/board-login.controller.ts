import { Controller, Get, Inject, Post, Req, Res } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { ApiExcludeController } from '@nestjs/swagger';
import { createHash } from 'node:crypto';
import { API_KEYS } from '../auth/api-key.guard.js';
import { Public } from '../auth/public.decorator.js';
import { BOARD_PATH, BoardSessions, clearedSessionCookieLine, sessionCookieLine } from './board-sessions.js';

/** Where a person signs in to the board from a browser. */
export const BOARD_LOGIN_PATH = `${BOARD_PATH}/login`;
export const BOARD_LOGOUT_PATH = `${BOARD_PATH}/logout`;

interface LoginRequest {
  headers: Record<string, string | string[] | undefined>;
  body?: unknown;
  secure?: boolean;
  protocol?: string;
}

const STYLE =
  'body{font:16px/1.5 system-ui,sans-serif;max-width:28rem;margin:4rem auto;padding:0 1rem}' +
  'label,input,button{display:block;width:100%;box-sizing:border-box}input,button{font:inherit;padding:.5rem;margin:.25rem 0 1rem}' +
  '.error{color:#b00020}';
/** No script at all, the one inline style by its hash, forms posted to this origin only. */
const POLICY =
  `default-src 'none'; style-src 'sha256-${createHash('sha256').update(STYLE).digest('base64')}'; ` +
  "form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

const escapeHtml = (text: string) =>
  text.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!);

function loginPage(options: { error?: string; tenant?: string }): string {
  const signedIn = options.tenant
    ? `<p id="signed-in">Signed in for tenant <strong>${escapeHtml(options.tenant)}</strong>: <a href="${BOARD_PATH}">open the board</a>.</p>
<form method="post" action="${BOARD_LOGOUT_PATH}" id="logout-form"><button type="submit">Sign out</button></form>`
    : '';
  const error = options.error ? `<p class="error" id="login-error" role="alert">${escapeHtml(options.error)}</p>` : '';
  return `<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Sign in: idempotency board</title><style>${STYLE}</style></head>
<body>
<h1>Idempotency board</h1>
${signedIn}${error}
<form method="post" action="${BOARD_LOGIN_PATH}" id="login-form">
<label for="api-key">API key</label>
<input id="api-key" name="apiKey" type="password" autocomplete="current-password" required>
<button type="submit">Sign in</button>
</form>
<p>The key is sent in the form's body, never in a URL; the browser keeps only a session id, for the board's pages.</p>
</body>
</html>
`;
}

/**
 * The sample's way into the board from a plain browser: a form that posts an
 * API key, and a session cookie in return (an opaque id, HttpOnly,
 * SameSite=Strict, sent to /board only) that `ApiKeyGuard` accepts on the
 * board's routes, and on no other. A real app puts the board behind its own
 * sign-in instead.
 */
@Public()
@ApiExcludeController()
@Controller('board')
export class BoardLoginController {
  constructor(
    @Inject(API_KEYS) private readonly apiKeys: ReadonlyMap<string, string>,
    private readonly sessions: BoardSessions,
    private readonly adapterHost: HttpAdapterHost,
  ) {}

  @Get('login')
  form(@Req() request: LoginRequest, @Res() response: unknown): void {
    this.page(response, 200, { tenant: this.sessions.tenantOf(request.headers) });
  }

  @Post('login')
  login(@Req() request: LoginRequest, @Res() response: unknown): void {
    if (crossSite(request)) return this.page(response, 403, { error: 'Sign in from this page.' });
    const body = request.body as { apiKey?: unknown } | undefined;
    const key = typeof body?.apiKey === 'string' ? body.apiKey.trim() : '';
    const tenant = key === '' ? undefined : this.apiKeys.get(key);
    if (tenant === undefined) return this.page(response, 401, { error: 'That API key is not valid.' });
    this.adapter.setHeader(response, 'Set-Cookie', sessionCookieLine(this.sessions.open(tenant), isSecure(request)));
    this.adapter.setHeader(response, 'Cache-Control', 'no-store');
    this.adapter.redirect(response, 303, BOARD_PATH);
  }

  @Post('logout')
  logout(@Req() request: LoginRequest, @Res() response: unknown): void {
    if (crossSite(request)) return this.page(response, 403, { error: 'Sign out from this page.' });
    this.sessions.close(request.headers);
    this.adapter.setHeader(response, 'Set-Cookie', clearedSessionCookieLine(isSecure(request)));
    this.adapter.setHeader(response, 'Cache-Control', 'no-store');
    this.adapter.redirect(response, 303, BOARD_LOGIN_PATH);
  }

  private get adapter() {
    return this.adapterHost.httpAdapter;
  }

  private page(response: unknown, status: number, options: { error?: string; tenant?: string }): void {
    this.adapter.setHeader(response, 'Content-Type', 'text/html; charset=utf-8');
    this.adapter.setHeader(response, 'Content-Security-Policy', POLICY);
    this.adapter.setHeader(response, 'Cache-Control', 'no-store');
    this.adapter.setHeader(response, 'X-Content-Type-Options', 'nosniff');
    this.adapter.setHeader(response, 'Referrer-Policy', 'no-referrer');
    this.adapter.reply(response, loginPage(options), status);
  }
}

/** A form another site posts (a login forgery, which would sign the browser in as the forger): refused. */
function crossSite(request: LoginRequest): boolean {
  const site = request.headers['sec-fetch-site'];
  return typeof site === 'string' && site !== 'same-origin' && site !== 'none';
}

function isSecure(request: LoginRequest): boolean {
  return request.secure === true || request.protocol === 'https';
}
