// ESLint (9 or later) settings for page.js, used by check.sh when an eslint is installed.
// The rules are named one by one, not taken from a preset, so a newer eslint gives the same
// verdict; each catches a mistake a parse alone (node --check) lets through.
module.exports = [
  {
    files: ['page.js'],
    languageOptions: {
      ecmaVersion: 2020,
      sourceType: 'script',
      // The page runs in a browser and reaches it through the document, and the window for
      // its width (the charts are drawn again when it changes).
      globals: {document: 'readonly', window: 'readonly'},
    },
    linterOptions: {reportUnusedDisableDirectives: 'error'},
    rules: {
      'no-undef': 'error',
      'no-unused-vars': 'error',
      'no-redeclare': 'error',
      'no-shadow-restricted-names': 'error',
      'no-global-assign': 'error',
      'no-func-assign': 'error',
      'no-const-assign': 'error',
      'no-self-assign': 'error',
      'no-self-compare': 'error',
      'no-dupe-keys': 'error',
      'no-dupe-args': 'error',
      'no-duplicate-case': 'error',
      'no-fallthrough': 'error',
      'no-unreachable': 'error',
      'no-unsafe-finally': 'error',
      'no-unsafe-negation': 'error',
      'no-cond-assign': 'error',
      'no-constant-condition': 'error',
      'no-sparse-arrays': 'error',
      'no-loss-of-precision': 'error',
      'no-empty': 'error',
      'use-isnan': 'error',
      'valid-typeof': 'error',
      'eqeqeq': ['error', 'smart'],
      'strict': ['error', 'function'],
    },
  },
];
