//! The object stores a cluster process reads and writes the warehouse with: local files,
//! and each bucket or container of an object URL opened the way strata's tables open it
//! (`strata_engine::cluster::object_store_for`, settings from the environment), once.

use deltalake::datafusion::common::{DataFusionError, Result};
use deltalake::datafusion::execution::object_store::{
    DefaultObjectStoreRegistry, ObjectStoreRegistry,
};
use deltalake::logstore::object_store::ObjectStore;
use std::sync::Arc;
use url::Url;

/// DataFusion's registry (local files, stores registered by hand), opening object stores
/// on first use.
#[derive(Debug, Default)]
pub(crate) struct WarehouseStores {
    known: DefaultObjectStoreRegistry,
}

impl ObjectStoreRegistry for WarehouseStores {
    fn register_store(
        &self,
        url: &Url,
        store: Arc<dyn ObjectStore>,
    ) -> Option<Arc<dyn ObjectStore>> {
        self.known.register_store(url, store)
    }

    fn deregister_store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        self.known.deregister_store(url)
    }

    fn get_store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        if let Ok(store) = self.known.get_store(url) {
            return Ok(store);
        }
        let store = strata_engine::cluster::object_store_for(url)
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let root = Url::parse(&format!("{}://{}", url.scheme(), url.authority()))
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        self.known.register_store(&root, store.clone());
        Ok(store)
    }
}
