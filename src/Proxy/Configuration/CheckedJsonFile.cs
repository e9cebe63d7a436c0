using System.Text.Json;
using Microsoft.Extensions.Configuration;
using Microsoft.Extensions.Configuration.Json;

namespace Tern.Proxy.Configuration;

/// <summary>
/// A JSON settings file that remembers why its last load failed instead of throwing on the
/// poll's thread. On reload a broken file loads as empty, so without this a half-saved file
/// would silently drop its routes; the reloader sees the error and keeps the last good
/// configuration instead.
/// </summary>
internal sealed class CheckedJsonFile : JsonConfigurationSource
{
    /// <param name="path">The file.</param>
    /// <param name="label">How errors name it (config/appsettings.json, TERN_CONFIG (/path)).</param>
    /// <param name="optional">Whether a missing file is fine.</param>
    public CheckedJsonFile(string path, string label, bool optional)
    {
        Label = label;
        FullPath = System.IO.Path.GetFullPath(path);
        Path = System.IO.Path.GetFileName(FullPath);

        // A missing folder is reported as a problem of this file (see Error), never thrown.
        FileProvider = new PolledFolder(System.IO.Path.GetDirectoryName(FullPath)!);
        Optional = optional;
        ReloadOnChange = true;
        OnLoadException = context => context.Ignore = true;
    }

    public string FullPath { get; }

    public string Label { get; }

    /// <summary>Told what the configuration system threw when it applied a change to this file.</summary>
    public Action<Exception>? Failed
    {
        get => ((PolledFolder)FileProvider!).Failed;
        set => ((PolledFolder)FileProvider!).Failed = value;
    }

    public override IConfigurationProvider Build(IConfigurationBuilder builder) => new Provider(this);

    /// <summary>The files in a configuration whose last load failed, with the reason.</summary>
    internal static IEnumerable<ConfigurationProblem> Problems(IConfiguration configuration) =>
        configuration is IConfigurationRoot root
            ? root.Providers.OfType<Provider>().Where(p => p.Error is not null).Select(p => new ConfigurationProblem(p.File.Label, p.Error!))
            : [];

    internal sealed class Provider(CheckedJsonFile file) : JsonConfigurationProvider(file), LayeredSources.ILayer
    {
        public CheckedJsonFile File { get; } = file;

        private readonly ChildKeyIndex _index = new();
        private string? _parseError;
        private List<string> _emptied = [];

        public override IEnumerable<string> GetChildKeys(IEnumerable<string> earlierKeys, string? parentPath) =>
            _index.ChildKeys(Data, earlierKeys, parentPath);

        public string Label(string key) => File.Label;

        /// <summary>
        /// The keys written null or [] that the data holds now, with nothing under them: a file
        /// gone missing on reload is emptied without a Load, and a file may give a key both null
        /// and children ("a": null beside "a:b").
        /// </summary>
        public IEnumerable<string> EmptyLeaves() => _index.EmptyLeaves(Data).Intersect(_emptied, StringComparer.OrdinalIgnoreCase);

        /// <summary>Why the file's content is not in force, or null when it is.</summary>
        public string? Error
        {
            get
            {
                var info = new FileInfo(File.FullPath);
                return TernFile.Refusal(File.FullPath) is { } refusal ? refusal
                    : PolledFolder.Exists(info) ? TernFile.OpenProblem(File.FullPath) ?? _parseError
                    // Optional or not: a link that leads nowhere is a swap caught half-way, not a file left out.
                    : info.LinkTarget is not null ? $"it is a link to '{info.LinkTarget}', which leads to no file"
                    : File.Optional ? null
                    : Directory.Exists(System.IO.Path.GetDirectoryName(File.FullPath)) ? "the file does not exist" : "the folder does not exist";
            }
        }

        protected override void Dispose(bool disposing)
        {
            base.Dispose(disposing);
            if (disposing)
            {
                // The file provider (and its poll) belongs to this file alone.
                (File.FileProvider as IDisposable)?.Dispose();
            }
        }

        public override void Load(Stream stream)
        {
            try
            {
                using var copy = new MemoryStream();
                stream.CopyTo(copy);
                var bytes = copy.ToArray(); // read twice: by .NET's parser, which closes its stream, and by Emptied
                base.Load(new MemoryStream(bytes));
                _emptied = Emptied(bytes);
                _parseError = null;
            }
            catch (Exception ex)
            {
                _emptied = [];
                _parseError = $"not valid JSON: {(ex.InnerException ?? ex).Message}";
                throw;
            }
        }

        /// <summary>
        /// The keys written as null or [], which ask for nothing there. Configuration cannot tell
        /// them from {}, a section left empty (the shipped "Certificates": {}), which is no request
        /// to take anything away.
        /// </summary>
        private static List<string> Emptied(byte[] json)
        {
            var keys = new List<string>();
            // Read as .NET's parser reads it: text decoded by a StreamReader, which takes a byte
            // order mark (UTF-8, or UTF-16 as Windows editors save).
            using var text = new StreamReader(new MemoryStream(json));
            using var document = JsonDocument.Parse(text.ReadToEnd(), new JsonDocumentOptions { CommentHandling = JsonCommentHandling.Skip, AllowTrailingCommas = true });
            Walk(document.RootElement, null);
            return keys;

            void Walk(JsonElement element, string? key)
            {
                switch (element.ValueKind)
                {
                    case JsonValueKind.Object:
                        foreach (var property in element.EnumerateObject())
                        {
                            Walk(property.Value, key is null ? property.Name : ConfigurationPath.Combine(key, property.Name));
                        }

                        break;
                    case JsonValueKind.Array when element.GetArrayLength() == 0 && key is not null:
                        keys.Add(key);
                        break;
                    case JsonValueKind.Array:
                        var index = 0;
                        foreach (var item in element.EnumerateArray())
                        {
                            Walk(item, ConfigurationPath.Combine(key ?? "", (index++).ToString(System.Globalization.CultureInfo.InvariantCulture)));
                        }

                        break;
                    case JsonValueKind.Null when key is not null:
                        keys.Add(key);
                        break;
                }
            }
        }
    }
}
