using Microsoft.Extensions.Configuration;
using Microsoft.Extensions.Configuration.Json;

namespace Tern.Proxy.Configuration;

/// <summary>
/// A JSON settings file that remembers why its last load failed instead of throwing on the file
/// watcher's thread. On reload a broken file loads as empty, so without this a half-saved file
/// would silently drop its routes; the reloader sees the error and keeps the last good
/// configuration instead.
/// </summary>
internal sealed class CheckedJsonFile : JsonConfigurationSource
{
    public CheckedJsonFile(string path, bool optional)
    {
        Path = System.IO.Path.GetFileName(path);
        FileProvider = new Microsoft.Extensions.FileProviders.PhysicalFileProvider(System.IO.Path.GetDirectoryName(System.IO.Path.GetFullPath(path))!);
        FullPath = System.IO.Path.GetFullPath(path);
        Optional = optional;
        ReloadOnChange = true;
        OnLoadException = context => context.Ignore = true;
    }

    public string FullPath { get; }

    public override IConfigurationProvider Build(IConfigurationBuilder builder) => new Provider(this);

    /// <summary>The files in a configuration whose last load failed, with the reason.</summary>
    internal static IEnumerable<ConfigurationProblem> Problems(IConfiguration configuration) =>
        configuration is IConfigurationRoot root
            ? root.Providers.OfType<Provider>().Where(p => p.Error is not null).Select(p => new ConfigurationProblem(p.File.FullPath, p.Error!))
            : [];

    internal sealed class Provider(CheckedJsonFile file) : JsonConfigurationProvider(file)
    {
        public CheckedJsonFile File { get; } = file;

        private string? _parseError;

        /// <summary>Why the file's content is not in force, or null when it is.</summary>
        public string? Error => !File.Optional && !System.IO.File.Exists(File.FullPath) ? "the file does not exist" : _parseError;

        protected override void Dispose(bool disposing)
        {
            base.Dispose(disposing);
            if (disposing)
            {
                // The file provider (and its inotify watcher) belongs to this file alone.
                (File.FileProvider as IDisposable)?.Dispose();
            }
        }

        public override void Load(Stream stream)
        {
            try
            {
                base.Load(stream);
                _parseError = null;
            }
            catch (Exception ex)
            {
                _parseError = $"not valid JSON: {(ex.InnerException ?? ex).Message}";
                throw;
            }
        }
    }
}
