// The tool kiln-tiny (models/kiln-tiny.gguf) was trained to call, and the gloss the suites
// hand back as its result, for every API surface's e2e suite: each wraps DICTIONARY_TOOL in its
// API's tool shape.
export const DICTIONARY_TOOL = {
  name: 'dictionary',
  description: 'Look up the meaning of an English word in the dictionary.',
  parameters: {
    type: 'object',
    properties: { word: { type: 'string', description: 'The word to look up' } },
    required: ['word'],
  },
};
export const RIVER = 'river (noun): a large natural stream of water (larger than a creek)';
